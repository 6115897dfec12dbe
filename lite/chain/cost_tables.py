"""Cost tables: measured prefill seconds per (prompt length, fixed chunk) for one model and
setting, plus what `--prefill auto` chose and took, recorded on a device by
tools/record_cost_tables.py and committed as data (tests/data/cost_tables/*.json), so that a CPU
test can check the chunk heuristic against real timings.

A table is a JSON object:

    {"format": "lite-cost-table", "version": 1,
     "model": file name, "command": what recorded it, "recorded": UTC time, "commit": lite's,
     "setting": {"model_key", "device", "experts", "expert_cache", "stages", "kv"},
     "profile": the CostProfile auto used (or null),
     "calibration": [[chunk, context, seconds], ["handoff", tokens, seconds], ...] (optional: the
                    timings that profile was fitted to, as lite/chain/calibrate.py keeps them),
     "rows": [{"prompt": 8192, "chunk": 4096 or "auto", "schedule": [sizes], "seconds": [...]}]}

Each row's seconds are the repeats of one prefill after the same warm-up; the figure used is
their median.
"""
import json
import statistics
from dataclasses import dataclass, field
from pathlib import Path

from lite.chain.chunking import choose_chunk, choose_schedule, describe_schedule, even_sizes
from lite.chain.cost_fit import calibrate
from lite.chain.cost_profile import CostProfile, ProfileKey
from lite.errors import LiteError

FORMAT = "lite-cost-table"
VERSION = 1
TOLERANCE = 0.03        # auto within 3% of the best fixed chunk (issue 28's acceptance)


class CostTableError(LiteError):
    """A cost table that cannot be read."""


@dataclass
class CostTable:
    model: str
    setting: ProfileKey
    profile: CostProfile = None
    fixed: dict = field(default_factory=dict)     # prompt -> {chunk: [seconds]}
    auto: dict = field(default_factory=dict)      # prompt -> (schedule, [seconds])
    command: str = ""
    path: str = ""
    samples: list = field(default_factory=list)   # the calibration's timings (see above)

    @property
    def layout(self):
        """(devices, stages per device) from the setting's stages, "DxK"."""
        d, _, k = self.setting.stages.partition("x")
        return int(d), float(k or 1)

    def median(self, prompt, chunk):
        return statistics.median(self.fixed[prompt][chunk])

    def best_fixed(self, prompt):
        """(chunk, median seconds) of the fastest fixed chunk at this prompt length."""
        return min(((c, self.median(prompt, c)) for c in self.fixed[prompt]), key=lambda x: x[1])

    def spread(self, prompt, chunk):
        runs = self.fixed[prompt][chunk]
        return (max(runs) - min(runs)) / statistics.median(runs)

    def to_json(self, extra=None):
        rows = [{"prompt": P, "chunk": c, "schedule": even_sizes(P, c), "seconds": s}
                for P, by in sorted(self.fixed.items()) for c, s in sorted(by.items())]
        rows += [{"prompt": P, "chunk": "auto", "schedule": list(sched), "seconds": s}
                 for P, (sched, s) in sorted(self.auto.items())]
        data = {"format": FORMAT, "version": VERSION, "model": self.model,
                "command": self.command, **(extra or {}),
                "setting": self.setting.__dict__,
                "profile": json.loads(self.profile.to_json()) if self.profile else None,
                "calibration": [list(x) for x in self.samples], "rows": rows}
        return json.dumps(data, indent=1)


def read_table(path):
    """A CostTable from its JSON file."""
    path = Path(path)
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError) as e:
        raise CostTableError(f"{path}: not a readable JSON cost table: {e}") from e
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        raise CostTableError(f"{path}: not a {FORMAT} file")
    if data.get("version") != VERSION:
        raise CostTableError(f"{path}: cost table version {data.get('version')!r}, this lite "
                             f"reads version {VERSION}")
    try:
        table = CostTable(model=str(data["model"]), setting=ProfileKey(**data["setting"]),
                          command=str(data.get("command", "")), path=str(path))
        if data.get("profile"):
            table.profile = CostProfile.from_json(json.dumps(data["profile"]))
        table.samples = [(a if a == "handoff" else int(a), int(b), float(t))
                         for a, b, t in data.get("calibration", [])]
        for row in data["rows"]:
            P, secs = int(row["prompt"]), [float(s) for s in row["seconds"]]
            if not secs or min(secs) <= 0:
                raise CostTableError(f"{path}: prompt {P}: no positive timings")
            if row["chunk"] == "auto":
                table.auto[P] = (tuple(int(c) for c in row["schedule"]), secs)
            else:
                table.fixed.setdefault(P, {})[int(row["chunk"])] = secs
    except (KeyError, TypeError, ValueError) as e:
        raise CostTableError(f"{path}: bad cost table: {e!r}") from e
    if not table.fixed:
        raise CostTableError(f"{path}: no fixed-chunk timings")
    return table


def read_tables(folder):
    """Every *.json cost table in a folder, sorted by file name ([] when there is none)."""
    folder = Path(folder)
    return [read_table(p) for p in sorted(folder.glob("*.json"))] if folder.is_dir() else []


@dataclass
class Verdict:
    """One prompt length of a table: what was chosen, its seconds, and the best fixed chunk."""
    prompt: int
    chosen: object          # a chunk size or a schedule
    seconds: float
    best_chunk: int
    best_seconds: float

    @property
    def ratio(self):
        return self.seconds / self.best_seconds

    @property
    def ok(self):
        return self.ratio <= 1 + TOLERANCE


def measured_auto(table):
    """The recorded `--prefill auto` runs against the best fixed chunk, per prompt length."""
    out = []
    for P, (sched, secs) in sorted(table.auto.items()):
        c, t = table.best_fixed(P)
        out.append(Verdict(P, sched, statistics.median(secs), c, t))
    return out


def heuristic_on_grid(table, profile=None):
    """The chunk choose_chunk picks among the table's own chunk sizes with `profile` (default the
    one recorded with the table), scored by the table's measured medians, per prompt length."""
    profile = profile or table.profile
    if profile is None:
        raise CostTableError(f"{table.path}: no profile recorded with this table")
    n_dev, k = table.layout
    out = []
    for P in sorted(table.fixed):
        c = choose_chunk(P, n_dev, profile, candidates=list(table.fixed[P]),
                         stages_per_device=k)
        c = min(table.fixed[P], key=lambda x: abs(x - c))    # a chunk capped at P is P's row
        best_c, best_t = table.best_fixed(P)
        out.append(Verdict(P, c, table.median(P, c), best_c, best_t))
    return out


def refit(table):
    """The profile lite's fitting code makes now from the calibration timings recorded with the
    table (lite/cost_fit.calibrate on them, the recorded profile giving the routing, the attention
    share and max_chunk): a change to the fit is checked on real timings without a GPU."""
    if not table.samples or table.profile is None:
        raise CostTableError(f"{table.path}: no calibration timings recorded with this table")
    points = {(c, ctx): t for c, ctx, t in table.samples if c != "handoff"}
    hand = {n: t for c, n, t in table.samples if c == "handoff"}
    p = table.profile
    return calibrate(lambda c, ctx: points[c, ctx], sorted({c for c, _ in points}),
                     sorted({ctx for _, ctx in points}), handoff_fn=hand.__getitem__ if hand else None,
                     repeats=1, key=table.setting, max_chunk=p.max_chunk, attn_share=p.attn_share,
                     n_expert=p.n_expert, expert_top_k=p.expert_top_k, expert_curve=p.expert_curve,
                     fit_overlap=table.setting.experts not in ("none", "gpu"))


def format_verdicts(table, verdicts):
    lines = [f"{table.model} [{table.setting.experts}{table.setting.expert_cache} stages "
             f"{table.setting.stages} kv {table.setting.kv}]"]
    for v in verdicts:
        chosen = describe_schedule(v.chosen) if isinstance(v.chosen, tuple) else v.chosen
        lines.append(f"  pp{v.prompt}: chose {chosen} {v.seconds:.4f} s, best fixed "
                     f"{v.best_chunk} {v.best_seconds:.4f} s ({100 * (v.ratio - 1):+.1f}%)"
                     f"{'' if v.ok else '  OUTSIDE 3%'}")
    return "\n".join(lines)


def auto_schedule(table, prompt, profile=None):
    """The schedule auto would run now for a prompt length of the table (the recorded profile)."""
    n_dev, k = table.layout
    return choose_schedule(prompt, n_dev, profile or table.profile, stages_per_device=k)
