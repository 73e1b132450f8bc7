"""The inspector's web app: read-only pages over Redis, server-rendered (Starlette, Jinja2, uvicorn).

Safe by default: it listens on 127.0.0.1 unless configured, refuses to listen anywhere else
without a bearer token (``inspector.token``), answers GET and HEAD only (405 otherwise), and
escapes everything a conversation holds (Jinja2's autoescape; the sawtooth's tooltips through
the SVG serializer). A Content-Security-Policy that allows only the app's own script stands
behind the escaping, not instead of it (the tests check the escaping itself); inline styles
are allowed, because matplotlib's SVG styles every element with its own ``style`` attribute.
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import ipaddress
import json
import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from pathlib import Path
from typing import Any
from urllib.parse import quote

import jinja2
from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.middleware.base import BaseHTTPMiddleware
from starlette.requests import Request
from starlette.responses import HTMLResponse, RedirectResponse, Response
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles

from compaction_worker.budget.threshold import scale_of
from compaction_worker.client.client import Client
from compaction_worker.contracts.history import text_with_calls
from compaction_worker.errors import ConfigError
from compaction_worker.inspector import sawtooth, views
from compaction_worker.inspector.counts import TranscriptCounts
from compaction_worker.observability import health
from compaction_worker.settings import InspectorSettings, Settings

log = logging.getLogger(__name__)

HERE = Path(__file__).resolve().parent
COOKIE = "inspector_token"
HEADERS = {
    "Content-Security-Policy": "default-src 'none'; script-src 'self'; style-src 'self' 'unsafe-inline'; img-src 'self' data:; "
    "base-uri 'none'; form-action 'self'; frame-ancestors 'none'",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-store",
}


def check_exposure(settings: InspectorSettings) -> None:
    """Refuse to serve conversations beyond this machine without a token."""
    if settings.token is None and not is_loopback(settings.host):
        raise ConfigError(
            f"the inspector would serve every conversation on {settings.host} without a token: "
            "set inspector.token (COMPACTION_INSPECTOR__TOKEN) or bind to 127.0.0.1"
        )


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False  # a host name: it may resolve anywhere


def environment() -> jinja2.Environment:
    """The templates, every value escaped unless a template says otherwise (only the drawn SVG)."""
    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(HERE / "templates"),
        autoescape=True,
        undefined=jinja2.StrictUndefined,
    )
    env.filters["q"] = lambda text: quote(str(text), safe="")
    env.filters["num"] = lambda value: f"{value:,}" if isinstance(value, int | float) else "-"
    env.filters["text"] = message_text
    env.filters["pretty"] = lambda value: json.dumps(value, indent=2, ensure_ascii=False)
    return env


def message_text(message: Mapping[str, Any]) -> str:
    """A message's text, its tool calls written out (escaped by the template like any text)."""
    text = text_with_calls(message, mark="→ ")
    if isinstance(message.get("content"), list) and any(p.get("type") != "text" for p in message["content"]):
        text += "\n[+non-text parts]"
    return text


class _Guard(BaseHTTPMiddleware):
    """The bearer token (header, or the cookie a ``?token=`` link set) and the security headers."""

    def __init__(self, app: Any, token: str | None) -> None:
        super().__init__(app)
        self.token = token

    async def dispatch(
        self, request: Request, call_next: Callable[[Request], Awaitable[Response]]
    ) -> Response:
        if self.token is not None:
            given = request.query_params.get("token")
            if given is not None and _same(given, self.token):
                # Trade the token in the URL for a cookie, and drop it from the address bar.
                query = "&".join(
                    f"{k}={quote(v)}" for k, v in request.query_params.multi_items() if k != "token"
                )
                target = request.url.path + (f"?{query}" if query else "")
                response: Response = RedirectResponse(target, status_code=303)
                response.set_cookie(COOKIE, self.token, httponly=True, samesite="strict")
                return _secured(response)
            header = request.headers.get("authorization", "")
            bearer = header[7:] if header.lower().startswith("bearer ") else None
            cookie = request.cookies.get(COOKIE)
            if not any(v is not None and _same(v, self.token) for v in (bearer, cookie)):
                denied = Response("a bearer token is required\n", 401, {"WWW-Authenticate": "Bearer"})
                return _secured(denied)
        return _secured(await call_next(request))


def _same(given: str, token: str) -> bool:
    return hmac.compare_digest(given.encode(), token.encode())


def _secured(response: Response) -> Response:
    response.headers.update(HEADERS)
    return response


def build_app(settings: Settings, client: Client) -> Starlette:
    """The app over ``client``'s Redis: ``/`` (conversations), ``/c/<id>`` (one conversation)."""
    env = environment()
    counts = TranscriptCounts(client.store)

    def page(name: str, status: int = 200, **values: Any) -> HTMLResponse:
        return HTMLResponse(env.get_template(name).render(**values), status_code=status)

    async def index(request: Request) -> Response:
        search = (request.query_params.get("q") or "").strip() or None
        found = await views.listing(client, settings, search)
        exact = search is not None and await client.exists(search)
        return page("index.html", listing=found, search=search or "", exact=search if exact else None)

    async def conversation(request: Request) -> Response:
        cid = request.path_params["cid"]
        view = await views.conversation(client, settings, cid, counts, request.query_params.get("at"))
        if view is None:
            return page("missing.html", 404, conversation_id=cid)
        drawn = sawtooth.series(
            view.counts, view.log, fixed=view.meta.fixed_tokens, scale=scale_of(view.meta)
        )
        chart, chart_error = None, None
        try:
            # Drawing is CPU: in a thread, so other requests are served meanwhile.
            chart = await asyncio.to_thread(
                sawtooth.svg,
                drawn,
                threshold=view.stats.moved_threshold or view.stats.threshold,
                target=view.stats.target,
                window=view.stats.window,
            )
        except RuntimeError as e:  # matplotlib missing
            chart_error = str(e)
        return page("conversation.html", v=view, drawn=drawn, chart=chart, chart_error=chart_error)

    token = settings.inspector.token
    return Starlette(
        routes=[
            Route("/", index, methods=["GET"]),
            Route("/c/{cid:path}", conversation, methods=["GET"]),
            Mount("/static", StaticFiles(directory=HERE / "static"), name="static"),
        ],
        middleware=[Middleware(_Guard, token=token.get_secret_value() if token else None)],
    )


@contextlib.asynccontextmanager
async def serving(settings: Settings, client: Client) -> AsyncIterator[str]:
    """Serve the inspector while the block runs; yields its base URL (the OS's port for port 0)."""
    config = settings.inspector
    check_exposure(config)
    async with health.serving(build_app(settings, client), config.host, config.port) as sock:
        host = f"[{config.host}]" if ":" in config.host else config.host
        yield f"http://{host}:{sock.getsockname()[1]}"


async def serve(settings: Settings, say: Callable[[str], None] = print) -> None:
    """Serve the inspector over the configured Redis until cancelled (Ctrl-C)."""
    check_exposure(settings.inspector)
    if not settings.redis.url:
        raise ConfigError("no Redis configured for the inspector (COMPACTION_REDIS__URL)")
    async with Client.connect(settings, kafka=False) as client, serving(settings, client) as url:
        say(
            f"inspector (read-only) on {url}/"
            + (" (bearer token required)" if settings.inspector.token else "")
        )
        await asyncio.Event().wait()
