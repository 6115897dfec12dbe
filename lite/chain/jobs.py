"""The jobs the stage chain (lite/chain/pipeline.py) carries through its stages: a request's prompt chunk
or decode step (ChunkJob), and a server step (StepJob: the stacked rows of several sequences)."""
from dataclasses import dataclass, replace
from typing import Any, Callable, Sequence

from lite.errors import LiteError


class StageError(LiteError):
    """A stage failed on a job; the runner's own exception is the __cause__."""

    def __init__(self, stage, job, cause):
        self.stage, self.chunk, self.request_id = stage, job.index, job.request_id
        super().__init__(f"stage {stage} failed on {job.describe()}: {type(cause).__name__}: {cause}")
        self.__cause__ = cause


@dataclass(frozen=True)
class ChunkJob:
    request_id: int
    index: int          # chunk number within the request, from 0
    start: int          # position of the chunk's first token in the sequence (KV/RoPE position)
    end: int            # one past its last token
    input: Any = None   # the first stage's input: token ids (T,) of this chunk
    last: bool = False  # the request's final chunk (the last stage computes logits for it)
    decode: bool = False

    @property
    def n_tokens(self):
        return self.end - self.start

    def describe(self):
        what = "decode step" if self.decode else f"chunk {self.index}"
        return f"{what} (tokens {self.start}..{self.end - 1}) of request {self.request_id}"

    @classmethod
    def decode_step(cls, request_id, pos, ids):
        """The job of one decode step at `pos` (ids: the token, shape (1,)): the same as
        ChunkJob(request_id, pos, pos, pos + 1, ids, last=True, decode=True), built without the
        frozen dataclass's per-field __setattr__ (a third of a decode step's Python)."""
        job = object.__new__(cls)
        job.__dict__.update(request_id=request_id, index=pos, start=pos, end=pos + 1, input=ids,
                            last=True, decode=True)
        return job


@dataclass(frozen=True)
class StepJob:
    """A server step (lite/engine/scheduler.py): prompt chunks and decode tokens of several
    sequences stacked, sequence i's counts[i] rows from its position starts[i]. The chain carries
    it through every stage in order on the caller's thread (StageChain.decode) and hands the
    runner of stage k the job `at(k)`: the stage reads its sequences' KV through kv_views(k) or,
    where `graphs` serves it, replays the decode graph of `graph_step` (lite/engine/paged_cuda.py
    DecodeGraphs, graph_step its step or None)."""
    index: int                                   # the scheduler's step number
    input: Any                                   # the rows' token ids, stacked
    starts: Sequence[int]
    counts: Sequence[int]
    kv_views: Callable[[int], list]              # stage index -> each sequence's KV view there
    graphs: Any = None
    graph_step: Any = None
    stage: int = 0                               # the stage it is at (at())
    request_id = 0                               # (a step has the rows of many requests)
    decode = True                                # serial and unclocked, as a decode step

    def at(self, stage):
        return replace(self, stage=stage)

    def describe(self):
        return f"step {self.index} ({sum(self.counts)} rows of {len(self.counts)} sequences)"


def make_jobs(ids, chunk, request_id=0, start=0):
    """ChunkJobs of `chunk` tokens (the last may be shorter) or of a tuple's sizes, from `start`."""
    if min(sizes := chunk if isinstance(chunk, tuple) else (chunk,)) < 1:
        raise LiteError(f"chunk size must be at least 1, got {chunk}")
    n = len(ids)
    if n == 0 or (sizes is chunk and sum(sizes) != n):
        raise LiteError(f"empty prompt, or a schedule not of its {n} tokens: nothing to prefill")
    bounds = ([sum(sizes[:i]) for i in range(len(sizes) + 1)] if sizes is chunk
              else [*range(0, n, chunk), n])
    return [ChunkJob(request_id, i, start + a, start + b, ids[a:b], last=(b == n))
            for i, (a, b) in enumerate(zip(bounds[:-1], bounds[1:]))]
