"""``python -m polar_mq.dev.model_server`` (also ``polar-mq model-server``): run the stand-in server."""

from __future__ import annotations

import argparse
import signal
import socket
import sys

from polar_mq.dev.model_server import DEFAULT_MAX_MODEL_LEN


def build_parser(prog: str = "polar-mq model-server") -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog=prog,
        description="A vLLM-compatible (OpenAI wire format) stand-in model server: real local "
        "tokenizer + chat template, deterministic scripted replies, no GPU.",
    )
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8000, help="0 picks a free port (printed in the ready line)")
    p.add_argument("--served-model-name", default="stand-in")
    p.add_argument("--max-model-len", type=int, default=DEFAULT_MAX_MODEL_LEN,
                   help="the context window served (default %(default)s: room for every shipped agent CLI)")
    p.add_argument("--scripted", metavar="FILE.json", help="a JSON list of steps (see polar_mq.dev.model_server.script)")
    p.add_argument("--no-token-ids", action="store_true",
                   help="ignore return_token_ids (prompt_token_ids/token_ids come back null)")
    p.add_argument("--latency-ms", type=int, default=0, help="extra delay before every answer")
    p.add_argument("--token-latency-ms", type=float, default=0.0,
                   help="delay per sampled token (between stream chunks; summed for a whole answer)")
    p.add_argument("--chat-template", default=None,
                   help="serve another chat template: a variant name (qwen3) or a Jinja file, as vLLM's flag")
    p.add_argument("--prompt-cache", type=int, default=0, metavar="N",
                   help="keep the ids of the last N rendered chat prompts (a repeated prompt skips "
                   "the tokenizer; the answer is the same)")
    p.add_argument("--no-dev-mode", action="store_true",
                   help="serve without vLLM's dev-mode routes (VLLM_SERVER_DEV_MODE unset): no RL API "
                   "(/pause, /resume, ...) and no /abort_requests")
    p.add_argument("--cache-dir", default=None, help="tokenizer cache root (default $POLAR_CACHE_DIR or ~/.cache/polar_mq)")
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    # gevent's WSGI server, monkey-patched before the app's modules are imported: HTTP/1.1 with
    # keep-alive as vLLM's uvicorn answers (a connection serves request after request, a body of
    # unknown length goes out chunked), and one greenlet per connection, so the slow streams of
    # bench/bench_gateway_streams.py cost no thread each. werkzeug's dev server, used before,
    # closes every connection (it cannot drain a body before the next request line), so every
    # gateway call to the stand-in paid a TCP connect on both sides of bench/bench_gateway.py
    # that production does not.
    from gevent import monkey

    if not monkey.is_module_patched("socket"):
        monkey.patch_all()
    import gevent
    from gevent.pywsgi import WSGIServer

    from polar_mq.dev.model_server.app import ServerConfig
    from polar_mq.dev.model_server.app import create_app
    from polar_mq.dev.model_server.script import load_script

    from polar_mq._io.fdlimit import raise_nofile

    raise_nofile(65536)  # a greenlet per connection: benches open thousands (bench_soak.py, bench_gateway_streams.py)
    scripted = load_script(args.scripted) if args.scripted else None
    config = ServerConfig(
        served_model_name=args.served_model_name,
        max_model_len=args.max_model_len,
        scripted=scripted,
        return_token_ids=not args.no_token_ids,
        latency_ms=args.latency_ms,
        token_latency_ms=args.token_latency_ms,
        cache_dir=args.cache_dir,
        chat_template=args.chat_template,
        prompt_cache=args.prompt_cache,
        dev_mode=not args.no_dev_mode,
    )
    app = create_app(config)
    class Server(WSGIServer):
        def handle(self, sock, address):  # type: ignore[no-untyped-def]
            # TCP_NODELAY as uvicorn sets it: a response written in pieces (head, then body or
            # chunks) otherwise waits for the client's delayed ACK (Nagle) on every call
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            return super().handle(sock, address)

    server = Server((args.host, args.port), app, log=None, error_log=None, backlog=2048)
    server.init_socket()
    port = server.server_port

    def _shutdown() -> None:
        server.stop(timeout=1)

    gevent.signal_handler(signal.SIGTERM, _shutdown)
    gevent.signal_handler(signal.SIGINT, _shutdown)
    print(f"polar-mq model-server ready on http://{args.host}:{port} "
          f"(model {args.served_model_name}, max_model_len {args.max_model_len})", flush=True)
    server.serve_forever()
    return 0


if __name__ == "__main__":
    sys.exit(main())
