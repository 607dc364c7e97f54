"""The stand-in model server: a Flask app speaking vLLM's OpenAI-compatible wire format.

Endpoints (as vLLM 0.32): ``GET /health``, ``GET /version``, ``GET /v1/models``,
``POST /v1/chat/completions`` (non-streaming and SSE streaming), ``POST /v1/completions``,
``POST /tokenize``, ``POST /detokenize``. Replies come from :mod:`.script` (deterministic), token ids
from the real local tokenizer (:mod:`.tokenizer`); "sampled" ids are the canonical encoding of the
completion text plus ``<|im_end|>`` when the turn ends naturally.

Tests: tests/dev/test_model_server.py; tests/vllm/test_contract.py (same wire as vLLM).
"""

from __future__ import annotations

import codecs
import json
import time
import uuid
from collections import OrderedDict
from dataclasses import dataclass
from http import HTTPStatus
from typing import Any, Iterator

from flask import Flask, Response, request

from polar_mq.dev.model_server.completion import completion_text
from polar_mq.dev.model_server.completion import logprob_entries
from polar_mq.dev.model_server.completion import new_tool_call_id
from polar_mq.dev.model_server.completion import parse_completion
from polar_mq.dev.model_server.completion import sampled_logprob
from polar_mq.dev.model_server.completion import token_deltas
from polar_mq.dev.model_server.generations import GenerationLog
from polar_mq.dev.model_server.prompt_chat import read_chat
from polar_mq.dev.model_server.templates import template
from polar_mq.dev.model_server.script import Reply
from polar_mq.dev.model_server.script import decide
from polar_mq.dev.model_server.tokenizer import ChatTokenizer
from polar_mq.dev.model_server.tokenizer import load_tokenizer

from polar_mq.dev.model_server import DEFAULT_MAX_MODEL_LEN

VLLM_VERSION = "0.32.0"


@dataclass
class ServerConfig:
    served_model_name: str = "stand-in"
    max_model_len: int = DEFAULT_MAX_MODEL_LEN
    scripted: list[dict] | None = None
    return_token_ids: bool = True  # False: behave like an upstream that ignores return_token_ids
    latency_ms: int = 0
    token_latency_ms: float = 0.0  # per sampled token: between stream chunks, summed when not streaming
    cache_dir: str | None = None
    chat_template: str | None = None  # a variant name (templates.TEMPLATES) or a Jinja file
    # Rendered chat prompts whose ids are kept (LRU; 0: every prompt is tokenized). Tokenizing a
    # large agent request keeps both cores busy long enough to disturb a benchmark;
    # bench/bench_gateway.py --upstream-prompt-cache measures the gateway against an upstream
    # that answers at once.
    prompt_cache: int = 0
    # vLLM's dev-mode routes (VLLM_SERVER_DEV_MODE=1): the RL API and /abort_requests (rl_api.py).
    # False: an upstream served without them, as a plain `vllm serve` is.
    dev_mode: bool = True


class APIError(Exception):
    def __init__(self, message: str, code: int = 400, err_type: str | None = None, param: str | None = None):
        super().__init__(message)
        self.message = message
        self.code = code
        self.err_type = err_type or _error_type(code)
        self.param = param


def _error_type(code: int) -> str:
    known = {400: "BadRequestError", 404: "NotFoundError", 500: "InternalServerError"}
    if code in known:
        return known[code]
    try:
        return HTTPStatus(code).phrase.replace(" ", "").replace("-", "") + "Error"
    except ValueError:
        return "Error"


def error_body(message: str, code: int, err_type: str | None = None, param: str | None = None) -> dict:
    """vLLM's ErrorResponse: ``{"error": {"message", "type", "param", "code"}}``."""
    return {"error": {"message": message, "type": err_type or _error_type(code), "param": param, "code": code}}


def _json_response(obj: Any, status: int = 200) -> Response:
    # compact, as vLLM writes it (starlette's JSONResponse; pydantic's model_dump_json for stream chunks)
    return Response(json.dumps(obj, ensure_ascii=False, separators=(",", ":")), status=status, mimetype="application/json")


def _error_response(e: APIError) -> Response:
    return _json_response(error_body(e.message, e.code, e.err_type, e.param), e.code)


def context_error(max_model_len: int, max_tokens: int | None) -> APIError:
    """vLLM's renderer-level length check message (the prompt is tokenised with
    ``max_length = max_input_tokens + 1``, hence "at least")."""
    out = max_tokens or 0
    n = max_model_len - out + 1
    return APIError(
        f"This model's maximum context length is {max_model_len} tokens. However, you requested "
        f"{out} output tokens and your prompt contains at least {n} input tokens, for a total of "
        f"at least {n + out} tokens. Please reduce the length of the input prompt or the number "
        f"of requested output tokens.",
        400,
        param="input_tokens",
    )


# ---- generation core ------------------------------------------------------------------------

@dataclass
class Generation:
    prompt_ids: list[int]
    reply: Reply
    ids: list[int]  # sampled ids actually returned
    text: str  # visible raw text (may be cut by a stop string)
    finish_reason: str
    stop_reason: str | int | None
    message: dict
    call_ids: list[str]
    prompt_text: str = ""


def _max_tokens(body: dict) -> int | None:
    v = body.get("max_completion_tokens")
    if v is None:
        v = body.get("max_tokens")
    if v is None:
        return None
    if isinstance(v, bool) or not isinstance(v, int):
        raise APIError("max_tokens must be an integer", 400, param="max_tokens")
    if v < 1:
        raise APIError(f"max_tokens must be at least 1, got {v}.", 400, param="max_tokens")
    return v


def _stops(body: dict) -> list[str]:
    s = body.get("stop")
    if s is None:
        return []
    if isinstance(s, str):
        return [s] if s else []
    if isinstance(s, list):
        return [x for x in s if isinstance(x, str) and x]
    raise APIError("stop must be a string or a list of strings", 400, param="stop")


def sample(tok: ChatTokenizer, reply: Reply, max_tokens: int | None, budget: int, stops: list[str],
           include_stop: bool = False) -> tuple[list[int], str, str, str | None]:
    """The sampled ids, visible text, finish_reason and stop_reason for a reply."""
    text = completion_text(reply)
    full = tok.encode(text) + [tok.eos_token_id]
    limit = budget if max_tokens is None else min(max_tokens, budget)
    # stop strings: earliest occurrence in the generated text
    best: tuple[int, str] | None = None
    for s in stops:
        i = text.find(s)
        if i >= 0 and (best is None or i < best[0]):
            best = (i, s)
    if best is not None:
        idx, s = best
        need = idx + len(s)
        n = 0
        while n < len(full) - 1 and len(tok.decode(full[:n])) < need:
            n += 1
        if n <= limit:
            visible = text[: need if include_stop else idx]
            return full[:n], visible, "stop", s
    if len(full) > limit:
        ids = full[:limit]
        return ids, tok.decode(ids), "length", None
    finish = "tool_calls" if reply.tool_calls else "stop"
    return full, text, finish, None


def build_message(reply: Reply, text: str, natural: bool, call_ids: list[str]) -> dict:
    if natural:
        reasoning = reply.reasoning or None
        content = reply.content if (reply.content or not reply.tool_calls) else None
        calls = [{"name": tc.name, "arguments": json.dumps(tc.arguments, ensure_ascii=False)}
                 for tc in reply.tool_calls]
    else:
        p = parse_completion(text)
        reasoning, content, calls = p.reasoning, p.content, p.tool_calls
    while len(call_ids) < len(calls):
        call_ids.append(new_tool_call_id())
    msg: dict[str, Any] = {
        "role": "assistant",
        "content": content,
        "refusal": None,
        "annotations": None,
        "audio": None,
        "function_call": None,
    }
    if calls:  # vLLM's ChatMessage serialiser drops an empty tool_calls list
        msg["tool_calls"] = [
            {"id": call_ids[i], "type": "function", "function": {"name": c["name"], "arguments": c["arguments"]}}
            for i, c in enumerate(calls)
        ]
    msg["reasoning"] = reasoning
    return msg


class StandIn:
    """State shared by the request handlers."""

    def __init__(self, config: ServerConfig):
        self.config = config
        self.tok = load_tokenizer(config.cache_dir)
        self.generations = GenerationLog()
        self._prompts: OrderedDict[str, list[int]] = OrderedDict()
        if config.chat_template:
            self.tok = self.tok.with_template(template(config.chat_template))

    def encode_prompt(self, text: str) -> list[int]:
        """A rendered chat prompt's ids; from the prompt cache when one is configured."""
        if not self.config.prompt_cache:
            return self.tok.encode(text)
        ids = self._prompts.get(text)
        if ids is None:
            ids = self._prompts[text] = self.tok.encode(text)
            while len(self._prompts) > self.config.prompt_cache:
                self._prompts.popitem(last=False)
        else:
            self._prompts.move_to_end(text)
        return list(ids)

    def check_model(self, body: dict) -> None:
        model = body.get("model")
        if model is not None and model != self.config.served_model_name:
            raise APIError(f"The model `{model}` does not exist.", 404, "NotFoundError", param="model")

    def chat(self, body: dict) -> Generation:
        if not isinstance(body, dict):
            raise APIError("Request body must be a JSON object", 400)
        self.check_model(body)
        messages = body.get("messages")
        if not isinstance(messages, list) or not messages:
            raise APIError("messages: Field required (a non-empty list)", 400, param="messages")
        if any(not isinstance(m, dict) or not isinstance(m.get("role"), str) for m in messages):
            raise APIError("messages: each message must be an object with a role", 400, param="messages")
        n = body.get("n", 1)
        if n not in (None, 1):
            raise APIError("The stand-in model server supports only n=1", 400, param="n")
        tools = body.get("tools") or None
        if tools is not None and not isinstance(tools, list):
            raise APIError("tools must be a list", 400, param="tools")
        max_tokens = _max_tokens(body)
        stops = _stops(body)
        kw = body.get("chat_template_kwargs") or {}
        if not isinstance(kw, dict):
            raise APIError("chat_template_kwargs must be an object", 400, param="chat_template_kwargs")
        kw = {k: v for k, v in kw.items() if k not in ("messages", "tools", "add_generation_prompt")}
        cont = bool(body.get("continue_final_message"))
        add_gen = bool(body.get("add_generation_prompt", True))
        if cont and add_gen and "add_generation_prompt" in body:
            raise APIError("Cannot set both `continue_final_message` and `add_generation_prompt` to True.",
                           400)
        try:
            prompt_text = self.tok.render(messages, tools=tools, add_generation_prompt=add_gen and not cont, **kw)
        except Exception as e:  # template errors -> 400 as vLLM
            raise APIError(f"Chat template error: {e}", 400) from e
        if cont and prompt_text.endswith("<|im_end|>\n"):  # leave the final message open
            prompt_text = prompt_text[: -len("<|im_end|>\n")]
        prompt_ids = self.encode_prompt(prompt_text)
        L = self.config.max_model_len
        if len(prompt_ids) + (max_tokens or 0) > L or len(prompt_ids) >= L:
            raise context_error(L, max_tokens)
        reply = decide(
            messages,
            tools,
            tool_choice=body.get("tool_choice"),
            response_format=body.get("response_format"),
            scripted=self.config.scripted,
        )
        if reply.fail is not None:
            if reply.sleep:
                time.sleep(reply.sleep)
            raise APIError(reply.fail_message or "Scripted failure", reply.fail)
        budget = L - len(prompt_ids)
        ids, text, finish, stop_reason = sample(
            self.tok, reply, max_tokens, budget, stops, bool(body.get("include_stop_str_in_output"))
        )
        natural = finish in ("stop", "tool_calls") and stop_reason is None
        call_ids: list[str] = []
        message = build_message(reply, text, natural, call_ids)
        return Generation(prompt_ids, reply, ids, text, finish, stop_reason, message, call_ids, prompt_text)

    def wants_ids(self, body: dict) -> bool:
        return bool(body.get("return_token_ids")) and self.config.return_token_ids

    def generate_whole(self, rid: str, gen: Generation, body: dict) -> Generation:
        """A plain (non-streamed) generation, taking the configured time, that an abort by id
        (`/abort_requests`) cuts short: then, as vLLM, the answer holds what was sampled so far
        with finish_reason "abort"."""
        stop = self.generations.start(rid, len(gen.ids), body)
        sent = len(gen.ids)
        try:
            wait = gen.reply.sleep + self.config.latency_ms / 1000.0
            if wait > 0 and stop.wait(wait):
                sent = 0
            elif self.config.token_latency_ms:
                for i in range(len(gen.ids)):
                    if stop.wait(self.config.token_latency_ms / 1000.0):
                        sent = i
                        break
                    self.generations.token(rid)
            else:
                self.generations.token(rid, len(gen.ids))
        finally:
            self.generations.finish(rid, "abort" if sent < len(gen.ids) else gen.finish_reason or "stop")
        if sent == len(gen.ids):
            return gen
        ids = gen.ids[:sent]
        text = self.tok.decode(ids)
        call_ids: list[str] = []
        return Generation(gen.prompt_ids, gen.reply, ids, text, "abort", None,
                          build_message(gen.reply, text, False, call_ids), call_ids, gen.prompt_text)

    def delay(self, gen: Generation) -> None:
        total = gen.reply.sleep + self.config.latency_ms / 1000.0
        if total > 0:
            time.sleep(total)

    def logprobs_k(self, body: dict) -> int | None:
        """None: no logprobs; else the number of top_logprobs."""
        if not body.get("logprobs"):
            return None
        k = body.get("top_logprobs") or 0
        if not isinstance(k, int) or k < 0:
            raise APIError("top_logprobs must be a non-negative integer", 400, param="top_logprobs")
        return k

    def prompt_logprobs(self, body: dict, prompt_ids: list[int]) -> list | None:
        k = body.get("prompt_logprobs")
        if k is None or k is False:
            return None
        out: list = [None]
        for i, t in enumerate(prompt_ids[1:], start=1):
            out.append({str(t): {"logprob": sampled_logprob(t, -i), "rank": 1,
                                 "decoded_token": self.tok.token_str(t)}})
        return out


def _usage(prompt: int, completion: int) -> dict:
    return {"prompt_tokens": prompt, "total_tokens": prompt + completion, "completion_tokens": completion,
            "prompt_tokens_details": None, "completion_tokens_details": None}


def _stream_usage(prompt: int, completion: int, details: bool = False) -> dict:
    """Usage in stream chunks: the final usage chunk is dumped with exclude_none; continuous usage
    stats carry an explicit ``completion_tokens_details: null``."""
    out = {"prompt_tokens": prompt, "total_tokens": prompt + completion, "completion_tokens": completion}
    if details:
        out = {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion,
               "completion_tokens_details": None}
    return out


def system_fingerprint(config: "ServerConfig") -> str:
    """vLLM's default (``--fingerprint-mode full``): ``vllm-<version>-<hash8 of the config>``."""
    import hashlib

    h = hashlib.sha256(f"{config.served_model_name}|{config.max_model_len}".encode()).hexdigest()[:8]
    return f"vllm-{VLLM_VERSION}-{h}"


def _sse(obj: Any) -> str:
    return "data: " + json.dumps(obj, ensure_ascii=False, separators=(",", ":")) + "\n\n"


# ---- app factory ----------------------------------------------------------------------------

def create_app(config: ServerConfig | dict | None = None) -> Flask:
    if config is None:
        config = ServerConfig()
    elif isinstance(config, dict):
        config = ServerConfig(**config)
    state = StandIn(config)
    tok = state.tok
    fingerprint = system_fingerprint(config)
    app = Flask("polar_mq.dev.model_server")
    # Key order is data here (tool arguments, schemas render into prompts): never sort it.
    app.json.sort_keys = False
    app.config["STAND_IN"] = state
    from polar_mq.dev.model_server.rl_api import register as register_rl_api
    if config.dev_mode:  # vLLM's /pause, /abort_requests...
        app.config["RL_API"] = register_rl_api(app, state.generations)

    def body_json() -> dict:
        data = request.get_data(cache=True)
        if not data:
            raise APIError("Request body is empty; expected JSON", 400)
        try:
            obj = json.loads(data)
        except ValueError as e:
            raise APIError(f"JSON decode error: {e}", 400) from e
        if not isinstance(obj, dict):
            raise APIError("Request body must be a JSON object", 400)
        return obj

    @app.errorhandler(APIError)
    def _api_error(e: APIError):
        return _error_response(e)

    @app.errorhandler(404)
    def _not_found(e):
        return _json_response({"detail": "Not Found"}, 404)

    @app.errorhandler(405)
    def _not_allowed(e):
        return _json_response({"detail": "Method Not Allowed"}, 405)

    @app.get("/health")
    def health():
        return Response(b"", status=200)

    @app.get("/ping")
    def ping():
        return Response(b"", status=200)

    @app.get("/version")
    def version():
        return _json_response({"version": VLLM_VERSION})

    @app.get("/metrics")
    def metrics():
        return Response(state.generations.prometheus(config.served_model_name),
                        mimetype="text/plain", headers={"Content-Type": "text/plain; version=0.0.4; charset=utf-8"})

    @app.get("/polar/generations")
    def generations():
        return _json_response(state.generations.snapshot())

    @app.get("/v1/models")
    def models():
        now = int(time.time())
        name = config.served_model_name
        return _json_response({
            "object": "list",
            "data": [{
                "id": name, "object": "model", "created": now, "owned_by": "vllm", "root": name,
                "parent": None, "max_model_len": config.max_model_len,
                "permission": [{
                    "id": f"modelperm-{uuid.uuid4().hex}", "object": "model_permission", "created": now,
                    "allow_create_engine": False, "allow_sampling": True, "allow_logprobs": True,
                    "allow_search_indices": False, "allow_view": True, "allow_fine_tuning": False,
                    "organization": "*", "group": None, "is_blocking": False,
                }],
            }],
        })

    @app.post("/tokenize")
    def tokenize():
        body = body_json()
        state.check_model(body)
        if "messages" in body:
            msgs = body.get("messages")
            if not isinstance(msgs, list):
                raise APIError("messages must be a list", 400, param="messages")
            kw = body.get("chat_template_kwargs") or {}
            try:
                text = tok.render(msgs, tools=body.get("tools") or None,
                                  add_generation_prompt=body.get("add_generation_prompt", True), **kw)
            except Exception as e:
                raise APIError(f"Chat template error: {e}", 400) from e
        elif isinstance(body.get("prompt"), str):
            text = body["prompt"]
        else:
            raise APIError("Either prompt (string) or messages must be given", 400)
        ids = tok.encode(text)
        out = {"count": len(ids), "max_model_len": config.max_model_len, "tokens": ids, "token_strs": None}
        if body.get("return_token_strs"):
            out["token_strs"] = [tok._tok.id_to_token(i) for i in ids]
        return _json_response(out)

    @app.post("/detokenize")
    def detokenize():
        body = body_json()
        state.check_model(body)
        ids = body.get("tokens")
        if not isinstance(ids, list) or not all(isinstance(i, int) and not isinstance(i, bool) for i in ids):
            raise APIError("tokens must be a list of integers", 400, param="tokens")
        if any(i < 0 or i >= tok.vocab_size for i in ids):
            raise APIError("Token id out of vocabulary range", 400, param="tokens")
        return _json_response({"prompt": tok.decode(ids)})

    @app.post("/v1/chat/completions")
    def chat_completions():
        body = body_json()
        gen = state.chat(body)
        k = state.logprobs_k(body)
        want_ids = state.wants_ids(body)
        as_ids = bool(body.get("return_tokens_as_token_ids"))
        # As vLLM: the request is named after X-Request-Id when the client sends one (the id
        # /abort_requests stops it by), else a random id.
        rid = f"chatcmpl-{request.headers.get('X-Request-Id') or uuid.uuid4().hex}"
        created = int(time.time())
        model = config.served_model_name
        if not body.get("stream"):
            gen = state.generate_whole(rid, gen, body)
            choice = {
                "index": 0,
                "message": gen.message,
                "logprobs": {"content": logprob_entries(tok, gen.ids, 0, k, as_ids)} if k is not None else None,
                "finish_reason": gen.finish_reason,
                "stop_reason": gen.stop_reason,
                "token_ids": gen.ids if want_ids else None,
                "routed_experts": None,
            }
            return _json_response({
                "id": rid, "object": "chat.completion", "created": created, "model": model,
                "choices": [choice], "service_tier": None, "system_fingerprint": fingerprint,
                "usage": _usage(len(gen.prompt_ids), len(gen.ids)),
                "prompt_logprobs": state.prompt_logprobs(body, gen.prompt_ids),
                "prompt_token_ids": gen.prompt_ids if want_ids else None,
                "prompt_text": gen.prompt_text if body.get("return_prompt_text") else None,
                "kv_transfer_params": None, "ec_transfer_params": None, "metrics": None,
            })
        so = body.get("stream_options") or {}
        include_usage = bool(so.get("include_usage"))
        continuous = include_usage and bool(so.get("continuous_usage_stats"))
        state.delay(gen)

        def frames() -> Iterator[str]:
            # As vLLM: a client that closes the connection aborts the generation (counted).
            state.generations.start(rid, len(gen.ids), body)
            reason = "abort"
            try:
                yield from token_frames()
                reason = gen.finish_reason or "stop"
            finally:
                state.generations.finish(rid, reason)

        def token_frames() -> Iterator[str]:
            # As vLLM 0.32 (serving.py, chat_completion_stream_generator): a first chunk with the
            # role (and prompt_token_ids / prompt_text keys, null unless asked for); then one chunk
            # per sampled token -- a token whose delta is empty is skipped unless return_token_ids
            # or logprobs is on (then it comes as ``delta: {}`` so that no id is lost); the last
            # token's chunk carries finish_reason + stop_reason; system_fingerprint rides on it,
            # or on the usage chunk (exclude_none) when include_usage is on.
            base = {"id": rid, "object": "chat.completion.chunk", "created": created, "model": model}
            n_prompt = len(gen.prompt_ids)
            first_choice = {"index": 0, "delta": {"role": "assistant", "content": ""}, "logprobs": None,
                            "finish_reason": None}
            first = dict(base, choices=[first_choice],
                         prompt_token_ids=gen.prompt_ids if want_ids else None,
                         prompt_text=gen.prompt_text if body.get("return_prompt_text") else None)
            if continuous:
                first["usage"] = _stream_usage(n_prompt, 0, details=True)
            yield _sse(first)
            call_ids = list(gen.call_ids)
            while len(call_ids) < len(gen.reply.tool_calls):
                call_ids.append(new_tool_call_id())
            names = [tc.name for tc in gen.reply.tool_calls]
            deltas = token_deltas(tok, gen.reply, gen.ids, call_ids, names, limit=len(gen.text))
            per_token = want_ids or k is not None
            last = len(gen.ids) - 1
            rl = app.config.get("RL_API")
            for i, (t, delta) in enumerate(zip(gen.ids, deltas)):
                if config.token_latency_ms:
                    time.sleep(config.token_latency_ms / 1000.0)
                if rl is not None and i:
                    rl.hold_in_flight()  # pause mode keep (rl_api.py)
                state.generations.token(rid)
                if delta is None and i != last and not per_token:
                    continue
                c: dict[str, Any] = {"index": 0, "delta": delta or {},
                                     "logprobs": {"content": logprob_entries(tok, [t], i, k, as_ids)}
                                     if k is not None else None,
                                     "finish_reason": None}
                if i == last:
                    c["finish_reason"] = gen.finish_reason
                    c["stop_reason"] = gen.stop_reason
                c["token_ids"] = [t] if want_ids else None
                obj = dict(base, choices=[c])
                if i == last and not include_usage:
                    obj["system_fingerprint"] = fingerprint
                if continuous:
                    obj["usage"] = _stream_usage(n_prompt, i + 1, details=True)
                yield _sse(obj)
            if include_usage:
                yield _sse(dict(base, choices=[], usage=_stream_usage(n_prompt, len(gen.ids)),
                                system_fingerprint=fingerprint))
            yield "data: [DONE]\n\n"

        return Response(frames(), mimetype="text/event-stream",
                        headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})

    @app.post("/v1/completions")
    def completions():
        body = body_json()
        state.check_model(body)
        prompt = body.get("prompt")
        if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], (str, list)):
            prompt = prompt[0]
        if isinstance(prompt, str):
            prompt_ids = tok.encode(prompt)
            prompt_text = prompt
        elif isinstance(prompt, list) and all(isinstance(i, int) and not isinstance(i, bool) for i in prompt):
            prompt_ids = list(prompt)
            if any(i < 0 or i >= tok.vocab_size for i in prompt_ids):
                raise APIError("Token id out of vocabulary range", 400, param="prompt")
            prompt_text = tok.decode(prompt_ids)
        else:
            raise APIError("prompt must be a string or a list of token ids", 400, param="prompt")
        if body.get("n", 1) not in (None, 1):
            raise APIError("The stand-in model server supports only n=1", 400, param="n")
        max_tokens = body.get("max_tokens", 16)
        if max_tokens is not None and (not isinstance(max_tokens, int) or max_tokens < 1):
            raise APIError(f"max_tokens must be at least 1, got {max_tokens}.", 400, param="max_tokens")
        L = config.max_model_len
        if len(prompt_ids) + (max_tokens or 0) > L or len(prompt_ids) >= L:
            raise context_error(L, max_tokens)
        chat = read_chat(prompt_text)
        if chat is not None:  # a rendered conversation (token-in continuation): answer as chat does
            msgs, tools = chat
            reply = decide(msgs, tools, scripted=config.scripted)
        else:
            reply = decide(_messages_from_prompt(prompt_text), None, scripted=None)
        if reply.fail is not None:
            raise APIError(reply.fail_message or "Scripted failure", reply.fail)
        ids, text, finish, stop_reason = sample(tok, reply, max_tokens, L - len(prompt_ids), _stops(body),
                                                bool(body.get("include_stop_str_in_output")))
        if finish == "tool_calls":  # /v1/completions parses nothing: a natural end is "stop"
            finish = "stop"
        if reply.sleep or config.latency_ms:
            time.sleep(reply.sleep + config.latency_ms / 1000.0)
        want_ids = state.wants_ids(body)
        k = body.get("logprobs")
        visible = text.replace(tok.eos_token, "")
        skip_special = bool(body.get("skip_special_tokens", True))
        if skip_special:  # vLLM's default drops special tokens from text
            for special in tok.special_ids:
                visible = visible.replace(special, "")
        lp = None
        if k is not None and k is not False:
            ents = logprob_entries(tok, ids, 0, int(k) if isinstance(k, int) else 0)
            offsets, off = [], 0
            for t in ids:
                offsets.append(off)
                off += len(tok.token_str(t))
            lp = {
                "text_offset": offsets,
                "token_logprobs": [e["logprob"] for e in ents],
                "tokens": [e["token"] for e in ents],
                # as vLLM 0.32: the sampled token first, then the top k (k = 0: the sampled one alone)
                "top_logprobs": [{e["token"]: e["logprob"], **{a["token"]: a["logprob"] for a in e["top_logprobs"]}}
                                 for e in ents],
            }
        rid = f"cmpl-{request.headers.get('X-Request-Id') or uuid.uuid4().hex}"
        created = int(time.time())
        usage = _usage(len(prompt_ids), len(ids))
        if body.get("stream"):
            include_usage = bool((body.get("stream_options") or {}).get("include_usage"))

            def frames() -> Iterator[str]:
                # Logged as chat streams are (generations.py): a client that leaves aborts it.
                state.generations.start(rid, len(ids), body)
                reason = "abort"
                try:
                    yield from completion_frames()
                    reason = finish or "stop"
                finally:
                    state.generations.finish(rid, reason)

            def completion_frames() -> Iterator[str]:
                # As vLLM 0.32: one chunk per token (text piece, its logprobs, token_ids; the
                # prompt ids on the first chunk only), finish_reason on the last token's chunk.
                base = {"id": rid, "object": "text_completion", "created": created, "model": config.served_model_name}
                dec = codecs.getincrementaldecoder("utf-8")(errors="replace")
                shown = 0
                last = len(ids) - 1
                for i, t in enumerate(ids):
                    hidden = t == tok.eos_token_id or (skip_special and tok.is_special(t))
                    piece = dec.decode(b"" if hidden else tok.raw_bytes(t))
                    piece = piece[: max(0, len(visible) - shown)]
                    shown += len(piece)
                    c = {"index": 0, "text": piece,
                         "logprobs": _slice_completion_logprobs(lp, i), "finish_reason": None,
                         "stop_reason": None,
                         "prompt_token_ids": prompt_ids if (want_ids and i == 0) else None,
                         "token_ids": [t] if want_ids else None}
                    obj = dict(base, choices=[c])
                    state.generations.token(rid)
                    if i == last:
                        c["finish_reason"], c["stop_reason"] = finish, stop_reason
                        if not include_usage:
                            obj["system_fingerprint"] = fingerprint
                    yield _sse(obj)
                if include_usage:
                    yield _sse(dict(base, choices=[], usage=_stream_usage(len(prompt_ids), len(ids)),
                                    system_fingerprint=fingerprint))
                yield "data: [DONE]\n\n"

            return Response(frames(), mimetype="text/event-stream")
        state.generations.whole(rid, len(ids), finish or "stop", body)
        return _json_response({
            "id": rid, "object": "text_completion", "created": created, "model": config.served_model_name,
            "choices": [{
                "index": 0, "text": visible, "logprobs": lp, "finish_reason": finish, "stop_reason": stop_reason,
                "token_ids": ids if want_ids else None, "prompt_logprobs": None,
                "prompt_token_ids": prompt_ids if want_ids else None, "routed_experts": None,
            }],
            "service_tier": None, "system_fingerprint": fingerprint, "usage": usage, "kv_transfer_params": None,
            "ec_transfer_params": None, "metrics": None,
        })

    return app


def _slice_completion_logprobs(lp: dict | None, i: int) -> dict | None:
    if lp is None:
        return None
    off0 = lp["text_offset"][i]
    return {"text_offset": [0 if i == 0 else off0], "token_logprobs": [lp["token_logprobs"][i]],
            "tokens": [lp["tokens"][i]], "top_logprobs": [lp["top_logprobs"][i]]}


def _messages_from_prompt(prompt_text: str) -> list[dict]:
    """Best effort: recover the last user turn from a rendered chat prompt."""
    marker = "<|im_start|>user\n"
    i = prompt_text.rfind(marker)
    if i >= 0:
        seg = prompt_text[i + len(marker):]
        seg = seg.split("<|im_end|>", 1)[0]
        return [{"role": "user", "content": seg}]
    return [{"role": "user", "content": prompt_text}]


__all__ = ["ServerConfig", "create_app", "error_body", "context_error"]
