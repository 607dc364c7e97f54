"""The GRPO example's learner: torch + transformers on CPU, one policy-gradient update per batch
of groups.

Loss (token level, over the positions whose loss_mask is 1 only):

    ratio_t = exp(logp_theta(y_t) - logp_behaviour(y_t))         behaviour = the logprobs vLLM
    loss    = -mean_t min(ratio_t * A, clip(ratio_t, 1-eps, 1+eps) * A)          reported when it sampled

with A the trajectory's group-relative advantage (polar_mq.rl.trainers.samples). The batch is split
into ``minibatches`` optimiser steps and passed over ``epochs`` times (PPO-style), so from the
second optimiser step on the ratio is no longer 1 and the clip bounds how far one batch can move
a token; the first forward also measures how far the trainer's logprobs are from vLLM's for the
same ids (numerics of two implementations of one model).
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from pathlib import Path

from examples.grpo.prefix_forward import hidden_states
from polar_mq.rl.trainers.samples import TrainSample


@dataclass
class StepStats:
    samples: int
    tokens_trained: int
    loss: float
    ratio_mean: float
    ratio_max: float
    clip_fraction: float
    behaviour_gap: float  # mean |logp_trainer - logp_vllm| on the masked tokens, before the update
    seconds: float
    tokens_processed: int = 0  # prompt + response tokens of every forward pass (all epochs): the ablation's cost


class PolicyTrainer:
    def __init__(self, model_dir: str | Path, *, lr: float = 2e-3, clip_eps: float = 0.2,
                 minibatches: int = 2, epochs: int = 1, seed: int = 0, threads: int = 1, optimizer: str = "adamw",
                 kl_coef: float = 0.0, trainable: str = "all", adam_eps: float = 1e-8,
                 train_layers: int = 0, head_rows: str = "all"):
        import torch
        from transformers import AutoModelForCausalLM

        torch.manual_seed(seed)
        torch.set_num_threads(threads)
        self.torch = torch
        self.model = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32)
        self.model.train()
        if train_layers > 0:
            freeze_below(self.model, train_layers)
        # GRPO's KL term (DeepSeekMath): the frozen starting policy as reference
        self.kl_coef = kl_coef
        self.ref = None
        if kl_coef > 0:
            self.ref = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32).eval()
            for p in self.ref.parameters():
                p.requires_grad_(False)
        # ``trainable`` "lm_head": only the output layer moves (the hidden states that read the prompt
        # stay as the base policy learnt them); "all": every parameter
        if trainable == "lm_head":
            for name, p in self.model.named_parameters():
                p.requires_grad_(name.startswith("lm_head."))
        elif trainable != "all":
            raise ValueError(f"unknown trainable {trainable!r} (all | lm_head)")
        params = [p for p in self.model.parameters() if p.requires_grad]
        if optimizer == "sgd":
            self.opt = torch.optim.SGD(params, lr=lr, momentum=0.0)
        elif optimizer == "adamw":
            # eps: gradients much smaller than it get proportionally small steps (the LM-head rows of
            # tokens never sampled get only softmax-normalisation gradients, ~1e-9; at eps 1e-8
            # AdamW still moves them at ~0.1 lr per step, in step with each other)
            self.opt = torch.optim.AdamW(params, lr=lr, weight_decay=0.0, betas=(0.9, 0.99), eps=adam_eps)
        else:
            raise ValueError(f"unknown optimizer {optimizer!r} (adamw | sgd)")
        # ``head_rows`` "sampled": the LM-head rows of tokens not sampled in a batch stay as they are
        # (AdamW moved every unsampled row by ~lr per element from their ~1e-9 softmax gradients, in
        # step: the tail rose en bloc and broke the tool-call format; docs/rl.md, Claude Code)
        if head_rows not in ("all", "sampled"):
            raise ValueError(f"unknown head_rows {head_rows!r} (all | sampled)")
        self.head_rows = head_rows
        self.clip_eps = clip_eps
        self.minibatches = max(1, minibatches)
        self.epochs = max(1, epochs)
        self.pad_id = int(self.model.config.pad_token_id or 0)

    def _token_logprobs(self, samples: list[TrainSample], model=None):
        """Logprobs of every response token under the current weights, as a padded [B, R]
        tensor, with the loss mask, behaviour logprobs and advantages aligned to it."""
        torch = self.torch
        model = model or self.model
        seqs = [s.input_ids for s in samples]
        rwidth = max(len(s.response_ids) for s in samples)
        # the LM head only where a response token is predicted (prompts are ~85% of each row:
        # full-sequence logits over the 4k vocabulary would dominate the step); a long prompt
        # every sample shares (a harness's system prompt and tools) runs once (prefix_forward)
        first = min(len(s.prompt_ids) for s in samples) - 1
        hidden, off = hidden_states(model, seqs, self.pad_id, first)
        pos = torch.zeros((len(samples), rwidth), dtype=torch.long)
        tgt = torch.zeros((len(samples), rwidth), dtype=torch.long)
        mask = torch.zeros((len(samples), rwidth))
        old = torch.zeros((len(samples), rwidth))
        for i, s in enumerate(samples):
            n_p, n_r = len(s.prompt_ids), len(s.response_ids)
            pos[i, :n_r] = torch.arange(n_p - 1 - off, n_p - 1 - off + n_r)
            tgt[i, :n_r] = torch.tensor(s.response_ids)
            mask[i, :n_r] = torch.tensor(s.loss_mask, dtype=torch.float32)
            old[i, :n_r] = torch.tensor(s.behaviour_logprobs, dtype=torch.float32)
        h = hidden.gather(1, pos.unsqueeze(-1).expand(-1, -1, hidden.shape[-1]))
        logp_all = torch.log_softmax(model.lm_head(h).float(), -1)
        lp = logp_all.gather(-1, tgt.unsqueeze(-1)).squeeze(-1) * (mask > 0)
        adv = torch.tensor([s.advantage for s in samples], dtype=torch.float32).unsqueeze(1)
        return lp, mask, old, adv

    def step(self, samples: list[TrainSample], lr_scale: float = 1.0) -> StepStats:
        """One batch: ``epochs`` passes of ``minibatches`` optimiser steps. ``lr_scale`` multiplies
        the learning rate for this batch only (the loop passes the fraction of groups that carry a
        signal: AdamW's steps have the same size whatever the batch, so without it one informative
        group of four moves the policy as far, in 8 epochs, as four do)."""
        torch = self.torch
        t0 = time.time()
        if not samples:
            return StepStats(0, 0, 0.0, 1.0, 1.0, 0.0, 0.0, 0.0)
        for group in self.opt.param_groups:
            group.setdefault("base_lr", group["lr"])
            group["lr"] = group["base_lr"] * lr_scale
        order = list(range(len(samples)))
        chunks = [order[i::self.minibatches] for i in range(self.minibatches)] * self.epochs
        total_tokens = sum(s.trained_tokens for s in samples)
        losses, ratios, ratio_max, clipped, gap, n_tok = [], [], 1.0, 0.0, None, 0.0
        processed = 0
        frozen = None
        if self.head_rows == "sampled":
            head = self.model.lm_head.weight
            frozen = torch.ones(head.shape[0], dtype=torch.bool)
            frozen[torch.tensor(sorted({t for s in samples for t, m in zip(s.response_ids, s.loss_mask) if m}), dtype=torch.long)] = False
            before = head.detach()[frozen].clone()
        for chunk in chunks:
            if not chunk:
                continue
            part = [samples[i] for i in chunk]
            processed += sum(len(s.input_ids) for s in part)
            lp, mask, old, adv = self._token_logprobs(part)
            ratio = torch.exp(lp - old)
            unclipped = ratio * adv
            clipped_obj = torch.clamp(ratio, 1 - self.clip_eps, 1 + self.clip_eps) * adv
            per_tok = -torch.minimum(unclipped, clipped_obj)
            if self.ref is not None:
                with torch.no_grad():
                    ref_lp = self._token_logprobs(part, self.ref)[0]
                # k3 estimator of KL(pi || ref), >= 0 per token
                per_tok = per_tok + self.kl_coef * (torch.exp(ref_lp - lp) - (ref_lp - lp) - 1)
            # token-level mean over the whole batch (every trained token weighs the same)
            loss = (per_tok * mask).sum() / max(1, total_tokens)
            self.opt.zero_grad()
            loss.backward()
            if frozen is not None and head.grad is not None:
                head.grad[frozen] = 0.0
            torch.nn.utils.clip_grad_norm_([p for p in self.model.parameters() if p.requires_grad], 1.0)
            self.opt.step()
            if frozen is not None:
                with torch.no_grad():
                    head[frozen] = before
            with torch.no_grad():
                m = mask.bool()
                r = ratio[m]
                if gap is None:
                    gap = float((lp - old).abs()[m].mean()) if m.any() else 0.0
                losses.append(float(loss) * max(1, total_tokens))
                ratios.append(float(r.sum()))
                n_tok += float(m.sum())
                ratio_max = max(ratio_max, float(r.max()) if r.numel() else 1.0)
                clipped += float(((r - 1).abs() > self.clip_eps).sum())
        return StepStats(samples=len(samples), tokens_trained=total_tokens,
                         loss=sum(losses) / max(1, total_tokens) / self.epochs, ratio_mean=sum(ratios) / max(1.0, n_tok),
                         ratio_max=ratio_max, clip_fraction=clipped / max(1.0, n_tok),
                         behaviour_gap=gap or 0.0, seconds=time.time() - t0, tokens_processed=processed)

    def save(self, out: str | Path) -> float:
        """Write the weights (safetensors + config) for vLLM to load; seconds spent."""
        t0 = time.time()
        out = Path(out)
        out.mkdir(parents=True, exist_ok=True)
        self.model.save_pretrained(out, safe_serialization=True)
        return time.time() - t0


def freeze_below(model, n: int) -> None:
    """Train only the last ``n`` decoder layers, the final norm and the (untied) LM head: the cheap
    variant for a real pretrained policy on CPU (examples/grpo/smollm.py). The frozen part still
    runs forward, and every weight (changed or not) is saved and synced into vLLM as usual."""
    layers = model.model.layers
    for p in model.parameters():
        p.requires_grad_(False)
    for mod in [*layers[max(0, len(layers) - n):], model.model.norm, model.lm_head]:
        for p in mod.parameters():
            p.requires_grad_(True)


def finite(x: float) -> bool:
    return not (math.isnan(x) or math.isinf(x))
