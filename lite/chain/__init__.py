"""The stage chain: the jobs it carries through the stages, its timeline, the chunk model that chooses
a prompt's chunks, and its calibration."""
