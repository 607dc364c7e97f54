"""model_server: the stand-in for vLLM (OpenAI wire format of vLLM 0.32, no GPU).

* :mod:`.tokenizer` -- ``load_tokenizer()`` / ``ChatTokenizer``: a real byte-level BPE (shipped in
  ``assets/tokenizer.json``) with a Qwen-style chat template, materialised HF-loadable on disk.
* :mod:`.script` -- ``decide()``: the deterministic reply policy and ``polar:*`` directives.
* :mod:`.completion` -- reply -> completion text / token ids / logprobs / stream deltas.
* :mod:`.app` -- ``create_app(ServerConfig)``: the Flask app.
* ``python -m polar_mq.model_server`` / ``polar-mq model-server`` -- ``__main__.main(argv)``.
"""
