"""scripts/build_tiny_model.py imports the provider adapters inside the vLLM venv, which has
none of the project's dependencies: the adapters must import, and frame SSE, without orjson."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

SCRIPT = """
import sys, importlib
sys.modules["orjson"] = None  # import orjson -> ImportError, as in the vLLM venv
for api in ("openai_chat", "anthropic", "openai_responses", "gemini"):
    importlib.import_module(f"polar_mq.proxy_app.adapters.{api}")
from polar_mq.proxy_app.adapters.base import sse
print(sse({"type": "ping", "x": "é"}, "ping").decode())
"""


def test_adapters_import_and_frame_without_orjson() -> None:
    out = subprocess.run([sys.executable, "-c", SCRIPT], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout == 'event: ping\ndata: {"type":"ping","x":"é"}\n\n\n'
