"""What llama.cpp knows of a vocabulary's tokens (llama.h, llama-vocab.cpp): the attributes of a token
and the GGUF token type each comes from, the texts it takes for end-of-generation, end-of-turn and
fill-in-the-middle tokens where the metadata names none, and the merge loop that both tokenizer models
run (BPE by merge rank, SentencePiece by score)."""
import heapq

# GGUF token types -> llama.cpp token attributes (llama.h)
A_UNKNOWN, A_UNUSED, A_NORMAL, A_CONTROL, A_USER, A_BYTE = 1, 2, 4, 8, 16, 32
A_LSTRIP, A_RSTRIP = 128, 256
TYPE_ATTR = {1: A_NORMAL, 2: A_UNKNOWN, 3: A_CONTROL, 4: A_USER, 5: A_UNUSED, 6: A_BYTE}

# Token texts llama.cpp treats as end of generation (llama_vocab::impl::load).
EOG_TEXTS = {
    "<|eot_id|>", "<|im_end|>", "<|end|>", "<|return|>", "<|call|>", "<|flush|>", "<|calls|>",
    "<end_of_turn>", "<|endoftext|>", "</s>", "<|eom_id|>", "<EOT>", "_<EOT>", "[EOT]", "[EOS]",
    "<|end_of_text|>", "<end_of_utterance>", "<eos>", "<turn|>", "<|tool_response>",
    "<｜end▁of▁sentence｜>", "[e~[",
}
EOT_TEXTS = ["<|eot_id|>", "<|im_end|>", "<|end|>", "<end_of_turn>", "<|endoftext|>",
             "<|end_of_text|>", "<EOT>", "_<EOT>", "[EOT]", "<｜end▁of▁sentence｜>",
             "<end_of_utterance>"]
FIM_TEXTS = {  # metadata key suffix -> texts llama.cpp recognises when the key is absent
    "fim_pad": ["<|fim_pad|>", "<fim-pad>", "<fim_pad>", "<PAD>", "[PAD]"],
    "fim_rep": ["<|fim_repo|>", "<|repo_name|>", "<fim-repo>", "<REPO>", "<reponame>"],
    "fim_sep": ["<|file_sep|>"],
}


def merge(syms, priority):
    """Merge neighbouring symbols, the pair with the lowest priority(a, b) first and the leftmost on
    ties (None: never); the symbols left, in order."""
    n = len(syms)
    nxt, prv = list(range(1, n + 1)), list(range(-1, n - 1))
    heap = []

    def add(left, right):
        if left >= 0 and right < n:
            p = priority(syms[left], syms[right])
            if p is not None:
                heapq.heappush(heap, (p, left, right, syms[left] + syms[right]))

    for i in range(n - 1):
        add(i, i + 1)
    while heap:
        _, left, right, merged = heapq.heappop(heap)
        if not syms[left] or not syms[right] or syms[left] + syms[right] != merged:
            continue                  # a pair one of whose symbols has merged since
        syms[left], syms[right] = merged, ""
        nxt[left] = nxt[right]
        if nxt[right] < n:
            prv[nxt[right]] = left
        add(prv[left], left)
        add(left, nxt[left])
    return [s for s in syms if s]
