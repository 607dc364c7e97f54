"""One forward pass over many sequences that start with the same long prefix, the prefix computed once.

A harness's prompt (Codex CLI's system prompt and tool schemas: ~930 tokens) is the same at the
start of every sample, and the part that differs (the task, the replies, the tool results) is
short. The prefix runs once at batch size 1 with a KV cache, the cache is repeated across the
batch, and only the suffixes run at batch size B: the same numbers as the plain padded forward
(gradients flow through the cached keys and values into the prefix's computation), about a tenth
of the work for Codex-sized prompts. Guarded by tests/rl/test_prefix_forward.py (equal hidden
states and gradients to the plain forward).
"""

from __future__ import annotations


def shared_prefix(seqs: list[list[int]]) -> int:
    """Length of the longest common prefix of every sequence."""
    if not seqs:
        return 0
    first, n = seqs[0], min(len(s) for s in seqs)
    k = 0
    while k < n and all(s[k] == first[k] for s in seqs):
        k += 1
    return k


def hidden_states(model, seqs: list[list[int]], pad_id: int, first_needed: int, min_shared: int = 256):
    """(hidden [B, W - off, H], off): the last hidden states of every position from ``off`` on, rows
    right-padded to the longest (W). ``first_needed``: the earliest position whose hidden state the
    caller reads (``off`` never exceeds it). The shared-prefix path runs when the rows share at
    least ``min_shared`` leading tokens, the plain padded forward (off = 0) otherwise."""
    import torch

    rows, width = len(seqs), max(len(s) for s in seqs)
    k = min(shared_prefix(seqs), first_needed)
    attn = torch.zeros((rows, width), dtype=torch.long)
    for i, ids in enumerate(seqs):
        attn[i, :len(ids)] = 1
    if k < min_shared:
        inp = torch.full((rows, width), pad_id, dtype=torch.long)
        for i, ids in enumerate(seqs):
            inp[i, :len(ids)] = torch.tensor(ids)
        return model.model(input_ids=inp, attention_mask=attn).last_hidden_state, 0
    prefix = model.model(input_ids=torch.tensor([seqs[0][:k]]), use_cache=True)
    cache = prefix.past_key_values
    cache.batch_repeat_interleave(rows)
    suffix = torch.full((rows, width - k), pad_id, dtype=torch.long)
    for i, ids in enumerate(seqs):
        suffix[i, :len(ids) - k] = torch.tensor(ids[k:])
    positions = torch.arange(k, width).unsqueeze(0).expand(rows, -1)
    out = model.model(input_ids=suffix, past_key_values=cache, attention_mask=attn, position_ids=positions,
                      use_cache=True)
    return out.last_hidden_state, k
