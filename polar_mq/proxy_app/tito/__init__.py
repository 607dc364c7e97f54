"""Token-in continuation (TITO): a call that continues a recorded call goes upstream as token ids.

Today's messages path lets vLLM re-render the whole history, and real templates do not round-trip
(Qwen3 puts an empty ``<think>\\n\\n</think>\\n\\n`` into the generation prompt but not into rendered
history, drops earlier reasoning, re-serialises tool-call arguments): call n+1's prompt is then not
call n's prompt + sampled ids, and the policy is trained on sequences it never produced. With TITO
the prompt is the parent's ``prompt_token_ids`` + ``completion_token_ids`` (+ the end-of-turn token
when it is missing) + the tokens of the new messages and the generation prompt.

Modes (``polar-mq gateway --tito auto|on|off``): ``on`` needs ``--tokenizer``; ``auto`` is on when
a tokenizer is given and the upstream takes token-id prompts on ``/v1/completions`` (probed at
start-up and by the health loop), else off; ``off`` is the messages path for every call.

Every record carries ``tito`` (its prompt was built from recorded ids), ``parent_call_id`` (the
call its conversation extends) and ``tito_reason`` (``continued`` or why not; see matching.py).

Tests: tests/tito/test_tito.py, tests/tito/test_tito_replays.py.
"""

from __future__ import annotations

import logging
from typing import Any

from polar_mq.model import CaptureRecord
from polar_mq.store.core import GatewayStore, StoreUnavailable
from polar_mq.proxy_app.adapters.base import ChatRequest
from polar_mq.proxy_app.upstream.pool import UpstreamPool
from polar_mq.proxy_app.tito.index import SessionIndex
from polar_mq.proxy_app.tito.prompt import TailError, continued_prompt
from polar_mq.proxy_app.tito.route import TitoRoute
from polar_mq.proxy_app.tito.tokenizer import LocalTokenizer, TokenizerError, load

log = logging.getLogger("polar_mq.tito")

MODES = ("auto", "on", "off")


class Tito:
    def __init__(self, mode: str, tokenizer_path: str | None, pool: UpstreamPool, store: GatewayStore):
        if mode not in MODES:
            raise ValueError(f"--tito must be one of {', '.join(MODES)}, got {mode!r}")
        self.mode = mode
        self.pool = pool
        self.store = store
        self.index = SessionIndex(store)  # what matching needs of each session's records (index.py)
        self.tokenizer_path = tokenizer_path
        self.tok: LocalTokenizer | None = None
        self.problem: str | None = None
        if mode != "off" and tokenizer_path:
            try:
                self.tok = load(tokenizer_path)
            except TokenizerError as exc:
                if mode == "on":
                    raise
                self.problem = str(exc)
        elif mode == "on":
            raise ValueError("--tito on needs --tokenizer PATH (the served model's tokenizer directory)")

    # --- is it on? -------------------------------------------------------------------------------
    def active(self) -> bool:
        if self.mode == "off" or self.tok is None:
            return False
        if self.mode == "on":
            return True
        return any(u.token_in for u in self.pool.upstreams if u.healthy)

    def describe(self) -> dict[str, Any]:
        """What /health says about token-in continuation."""
        active = self.active()
        if active:
            why = "continuations go upstream as token ids via /v1/completions"
        elif self.mode == "off":
            why = "--tito off: every call is rendered upstream from messages"
        elif self.tok is None:
            why = self.problem or "no --tokenizer given: the gateway cannot render new messages as tokens"
        else:
            why = "no healthy upstream takes token-id prompts on /v1/completions"
        return {"mode": self.mode, "active": active, "endpoint": "/v1/completions" if active else None,
                "tokenizer": self.tok.path if self.tok else self.tokenizer_path, "reason": why}

    # --- one call --------------------------------------------------------------------------------
    def route(self, record: CaptureRecord, req: ChatRequest) -> TitoRoute | None:
        """Match the call, fill its tito fields, and return the token-in route when it continues a
        recorded call (None: the messages path)."""
        if not self.active():
            record.tito_reason = "off"
            return None
        try:
            match = self.index.find_parent(record.session_id, req.messages, req.tools)
        except StoreUnavailable:
            record.tito_reason = "store_unavailable"
            return None
        record.tito_reason = match.reason
        if match.retry_of:
            record.notes.append(f"tito: same request as call {match.retry_of} (a retry)")
        if match.lineage is not None:
            record.parent_call_id = match.lineage
        if match.parent is None:
            return None
        params = req.params
        choice = params.get("tool_choice")
        if params.get("response_format") or choice == "required" or isinstance(choice, dict):
            record.tito_reason = "constrained_decoding"  # guided decoding lives on the chat path
            return None
        up = self.pool.ranked(record.session_id)[0]
        max_len = up.max_model_len or next((u.max_model_len for u in self.pool.upstreams
                                            if u.max_model_len), None)
        if not max_len and not (params.get("max_tokens") or params.get("max_completion_tokens")):
            record.tito_reason = "unknown_max_model_len"
            return None
        assert self.tok is not None
        try:
            prompt = continued_prompt(self.tok, match.parent, req.messages, req.tools,
                                      params.get("chat_template_kwargs") or {})
        except (TailError, Exception) as exc:  # a template that cannot render: messages path
            log.warning("tito: cannot render the tail of call %s: %s", record.call_id, exc)
            record.tito_reason = "template_error"
            record.notes.append(f"tito: tail not rendered ({exc})")
            return None
        record.tito = True
        if prompt.eos_added:
            record.notes.append("tito: end-of-turn token added after the parent's sampled ids")
        return TitoRoute(self.pool, self.tok, prompt.ids,
                         parse_tools=bool(req.tools) and choice != "none", max_model_len=max_len)


__all__ = ["Tito", "MODES"]
