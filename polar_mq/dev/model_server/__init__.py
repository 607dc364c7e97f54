"""model_server: the stand-in for vLLM (OpenAI wire format of vLLM 0.32, no GPU).

* :mod:`.tokenizer` -- ``load_tokenizer()`` / ``ChatTokenizer``: a real byte-level BPE (shipped in
  ``assets/tokenizer.json``) with a Qwen-style chat template, materialised HF-loadable on disk.
* :mod:`.script` -- ``decide()``: the deterministic reply policy and ``polar:*`` directives.
* :mod:`.completion` -- reply -> completion text / token ids / logprobs / stream deltas.
* :mod:`.app` -- ``create_app(ServerConfig)``: the Flask app.
* ``python -m polar_mq.dev.model_server`` / ``polar-mq model-server`` -- ``__main__.main(argv)``.
"""

# The window the stand-in serves unless told otherwise (`polar-mq up`/`demo` included): every agent
# CLI shipped in polar_mq/harnesses must fit its first request (system prompt + tools, up to ~30k
# tokens for Claude Code) plus the output cap harnesses/limits.py derives from it (with 8192, Claude
# Code refuses its first request: "Prompt is too long"). Guarded by tests/cli/test_cli_newcomer.py.
DEFAULT_MAX_MODEL_LEN = 65536
