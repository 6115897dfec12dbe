"""The engine: the Engine (a model's stages, one request's generation), the scheduler and its sequences,
each stage's runner (stage.py), its KV blocks and recurrent slots, and sampling."""
