"""One forward over the stacked rows of several sequences: the batched step of the server.

A layer's forward (models/*.py) sees BatchOps as its backend. Every op that treats rows alone
(embedding, norms, products with the weights, activations, experts) runs once on all rows, so each
weight is read once per step; RoPE and attention, which depend on a row's position and on its own
sequence's KV, run per sequence on that sequence's rows; so do a hybrid's causal conv and delta
rule, on the recurrent state each sequence's KV view carries (kvs[i].recurrent). A sequence contributes one row in decode
and a chunk of rows while its prompt is prefilled, so one step can mix both.
"""


class BatchOps:
    def __init__(self, ops, starts, counts, kvs):
        # sequence i: rows rows[i]:rows[i + 1], first position starts[i], KV view kvs[i]
        self.ops, self.starts, self.kvs = ops, starts, kvs
        self.rows = [0]
        for n in counts:
            self.rows.append(self.rows[-1] + n)

    def __getattr__(self, name):                 # the ops that treat rows alone
        return getattr(self.ops, name)

    def begin(self, pos0, n_tokens):
        pass                                     # positions are per sequence (rope, attention)

    def _per_sequence(self, fn, *xs):
        r = self.rows
        parts = [fn(i, *(x[r[i]:r[i + 1]] for x in xs)) for i in range(len(self.starts))]
        return parts[0] if len(parts) == 1 else self.ops.xp.concatenate(parts)

    def rope(self, x, pos0, *args, **kw):
        return self._per_sequence(lambda i, xi: self.ops.rope(xi, self.starts[i], *args, **kw), x)

    def attention(self, kv, il, q, k, v, pos0, scale, window=0):
        return self._per_sequence(
            lambda i, qi, ki, vi: self.ops.attention(self.kvs[i], il, qi, ki, vi, self.starts[i],
                                                     scale, window), q, k, v)

    def recurrent_state(self, kv, il, pos0, n_tokens):
        """Every sequence's (conv, delta-rule) state of layer il, as two lists."""
        r = self.rows
        got = [self.kvs[i].recurrent.take(il, self.starts[i], r[i + 1] - r[i])
               for i in range(len(self.starts))]
        return [c for c, _ in got], [s for _, s in got]

    def conv_silu(self, x, name, states):
        return self._per_sequence(lambda i, xi: self.ops.conv_silu(xi, name, states[i]), x)

    def delta_rule(self, q, k, v, g, beta, states, scale):
        return self._per_sequence(
            lambda i, *a: self.ops.delta_rule(*a, states[i], scale), q, k, v, g, beta)
