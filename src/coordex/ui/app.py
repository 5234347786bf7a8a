"""The page for a person (SPEC section 11), as a handler with no server in it.

:class:`UIApp` turns one HTTP request into a :class:`Response`; :mod:`coordex.ui.server`
serves it from a thread for ``Executor.serve_ui`` and ``coordex mcp --ui``, and
:mod:`coordex.ui.asgi` mounts it in ``coordex serve``. Which executor a request sees is
decided by its token alone (``lookup(token)``), so one app serves every tenant of a
server, each its own.

Routes under the prefix (default ``/ui``): the page, and the JSON API it alone uses
(:mod:`coordex.ui.api`): ``GET api/sessions``, ``api/calls``, ``api/calls/SEQ``,
``api/running``, ``api/inspect``; ``POST api/interrupt``, ``api/close``, ``api/rebuild``.

Who may ask (:mod:`coordex.ui.access`): a program sends ``Authorization: Bearer
<token>``. A browser passes the token once, as ``?token=...`` on the page's address; the
answer sets a cookie holding a random key of the server's own (never the token) and
sends the browser to the page with a second key in the address's fragment, which the
page keeps in its origin's storage and sends as a header with every API request.
Cookies do not tell ports apart, so a listener on another port of the same host gets
the cookie, but never the second key: both are needed. ``Host`` and ``Origin`` are
checked as on ``/mcp``, a cross-site ``?token=`` is refused, and a ``POST`` needs a
same-origin request.

Nothing here waits on a session: the executor's methods run on threads of the tenant's
own (:class:`TenantThreads`, a few per tenant) and an answer that takes longer than a
deadline is given up with a ``timeout`` answer, so one tenant's slow page never holds
another's, nor the server's stop.
"""

from __future__ import annotations

import functools
import threading
import weakref
from collections.abc import Callable, Mapping, Sequence
from importlib import resources
from typing import Any
from urllib.parse import parse_qs

from ..contract import ExecutorLike
from . import access, api

# (Request and Response are re-exported: what callers of the handler build and read.)
from .http import Request as Request
from .http import Response as Response
from .http import json_response, text_response

# Seconds a read (sessions, calls, inspect) may take before the page is told to try
# again, and an action (close, rebuild: a rebuild replays calls) before it is told the
# action goes on and the log will show its outcome.
READ_DEADLINE = 2.5
ACTION_DEADLINE = 30.0
THREADS_PER_TENANT = 4
@functools.cache
def _page() -> bytes:
    return resources.files("coordex.ui").joinpath("page.html").read_bytes()


Reply = Callable[[Response], None]


class TenantThreads:
    """A few threads per tenant for the page's calls into its executor.

    A job runs on a daemon thread of its own (so a host that never answers holds one
    thread, never the server's stop); at most ``size`` run at once per executor, and a
    request past that is answered at once that the page's threads are busy.
    """

    def __init__(self, size: int = THREADS_PER_TENANT) -> None:
        self.size = size
        self._slots: weakref.WeakKeyDictionary[Any, threading.BoundedSemaphore] = \
            weakref.WeakKeyDictionary()
        self._by_id: dict[int, threading.BoundedSemaphore] = {}  # executors without weakrefs
        self._lock = threading.Lock()

    def _slot(self, executor: ExecutorLike) -> threading.BoundedSemaphore:
        with self._lock:
            try:
                slot = self._slots.get(executor)
                if slot is None:
                    slot = self._slots[executor] = threading.BoundedSemaphore(self.size)
            except TypeError:
                slot = self._by_id.setdefault(id(executor), threading.BoundedSemaphore(self.size))
            return slot

    def submit(self, executor: ExecutorLike, job: Callable[[], Response], reply: Reply) -> bool:
        """Run ``job`` for ``executor`` and ``reply`` with its response; False (nothing
        started) when the tenant's threads are all busy."""
        slot = self._slot(executor)
        if not slot.acquire(blocking=False):
            return False

        def run() -> None:
            try:
                response = job()
            except Exception as exc:  # a coordex bug reaches the page as data
                response = json_response(500, {
                    "error": f"The page's request failed: {type(exc).__name__}: {exc}",
                    "error_type": "execution", "suggestion": "Reload the page."})
            finally:
                slot.release()
            reply(response)

        threading.Thread(target=run, name="coordex-ui-job", daemon=True).start()
        return True


class UIApp:
    """The page and its JSON API over whichever executor a token names.

    Args:
        lookup: ``lookup(token)`` -> the executor that token may see, or None. It must
            compare tokens in constant time.
        keys: where browsers' keys are kept (:class:`coordex.ui.keys.SignedKeys`, or
            :class:`coordex.ui.access.Keys` by default).
        prefix: the path the page lives at.
        allowed_hosts / allowed_origins: ``Host`` and ``Origin`` values accepted (a
            ``:*`` suffix matches any port); default: loopback names only.
    """

    def __init__(self, lookup: Callable[[str], ExecutorLike | None], prefix: str = "/ui",
                 allowed_hosts: Sequence[str] | None = None,
                 allowed_origins: Sequence[str] | None = None,
                 threads_per_tenant: int = THREADS_PER_TENANT, keys: Any = None) -> None:
        self.lookup = lookup
        self.prefix = prefix.rstrip("/")
        self.checks = access.Checks(allowed_hosts, allowed_origins)
        # The browsers' keys: signed with a secret under the data folder where one is
        # given (a login outlives a restart: coordex.ui.keys), else held in memory.
        self.keys = keys if keys is not None else access.Keys()
        self.threads = TenantThreads(threads_per_tenant)

    def handles(self, path: str) -> bool:
        return path == self.prefix or path.startswith(self.prefix + "/")

    # -- the two ways in ------------------------------------------------------------------

    def handle(self, method: str, path: str, query_string: str, headers: Mapping[str, str],
               body: bytes = b"") -> Response:
        """Answer one request, waiting for it (``headers`` keys lower-case)."""
        done = threading.Event()
        box: list[Response] = []

        def reply(response: Response) -> None:
            if not box:
                box.append(response)
            done.set()

        wait = self.start(Request(method, path, parse_qs(query_string, keep_blank_values=True),
                                  headers, body), reply)
        if not done.wait(wait):
            return _late(wait)
        return box[0]

    def start(self, request: Request, reply: Reply) -> float:
        """Begin answering ``request``; ``reply`` is called once with the response, now
        or from a tenant's thread. Returns the seconds to wait for it before answering
        :func:`late` instead."""
        refused = self.checks.refuse(request.method, request.headers)
        if refused is not None:
            reply(text_response(*refused))
            return 0.0
        rest = request.path[len(self.prefix):].strip("/")
        if rest == "":
            reply(self._page(request))
            return 0.0
        executor, by_cookie = self._who(request)
        if executor is None:
            reply(_unauthorized())
            return 0.0
        if request.method == "POST":
            refused = self.checks.refuse_post(request.headers, by_cookie)
            if refused is not None:
                reply(text_response(*refused))
                return 0.0
        route = api.route(request.method, rest)
        if route is None:
            reply(text_response(404, f"Not found: {rest!r}. The page is at {self.prefix}/.\n"))
            return 0.0
        if isinstance(route, int):
            reply(text_response(route, "Method not allowed here.\n"))
            return 0.0
        handler, is_action = route
        arguments = api.arguments(request, rest)
        if isinstance(arguments, Response):
            reply(arguments)
            return 0.0
        quick = api.answer_now(handler, executor, arguments)
        if quick is not None:
            reply(quick)
            return 0.0
        if not self.threads.submit(executor, lambda: handler(executor, arguments), reply):
            reply(json_response(503, {
                "error": "The page's threads for this tenant are all waiting on earlier "
                "requests (a session or a host that does not answer).",
                "error_type": "capacity", "suggestion": "Try again in a few seconds."}))
            return 0.0
        return ACTION_DEADLINE if is_action else READ_DEADLINE

    # -- the page and who is asking -------------------------------------------------------

    def _page(self, request: Request) -> Response:
        if request.method not in ("GET", "HEAD"):
            return text_response(405, "Only GET.\n")
        host = request.headers.get("host", "")
        token = request.query.get("token", [""])[0]
        if token:
            if request.headers.get("sec-fetch-site") not in (None, "none", "same-origin"):
                # A link elsewhere must not log this browser in (as its author): not
                # on another site, nor on another port of this host ("same-site": a
                # tenant's own listener on loopback is that). Typed, opened by the
                # user ("none") or from the page itself only; programs send no header.
                return text_response(403, "The token may not come from a link on another "
                                     "site. Open the page's URL yourself.\n")
            if request.headers.get("sec-fetch-site") is None and \
                    access.from_elsewhere(request.headers, host):
                # A browser without fetch metadata still says where a link was.
                return text_response(403, "The token may not come from a link on another "
                                     "page. Open the page's URL yourself.\n")
            if self.lookup(token) is None:
                return _unauthorized()
            cookie_key, page_key = self.keys.issue(token)
            return Response(303, b"", "text/plain", [
                ("Set-Cookie", access.set_cookie(host, cookie_key, self.prefix)),
                # The second key travels in the fragment: never sent to any server.
                ("Location", f"{self.prefix}/#key={page_key}")])
        if not request.path.endswith("/"):
            return Response(303, b"", "text/plain", [("Location", self.prefix + "/")])
        if self.keys.token_for_cookie(access.cookie_value(request.headers, host)) is None:
            return _unauthorized()
        return Response(200, _page(), "text/html; charset=utf-8")

    def _who(self, request: Request) -> tuple[Any | None, bool]:
        """The executor the request may see, and whether a browser's keys said so."""
        bearer = access.bearer(request.headers.get("authorization", ""))
        if bearer:
            return self.lookup(bearer), False
        token = request.query.get("token", [""])[0]
        if token and request.method == "GET":  # a program's GET; no cookie is set
            return self.lookup(token), False
        host = request.headers.get("host", "")
        kept = self.keys.token_for(access.cookie_value(request.headers, host),
                                   request.headers.get(access.PAGE_KEY_HEADER, ""))
        return (self.lookup(kept) if kept else None), True


def _unauthorized() -> Response:
    return text_response(401, "Unauthorized: open the URL with ?token=... once.\n",
                         [("WWW-Authenticate", 'Bearer realm="coordex"')])


def _late(waited: float) -> Response:
    return json_response(504, {
        "error": f"No answer within {waited:g} s: the executor is busy with this request.",
        "error_type": "timeout",
        "suggestion": "It goes on in the background; the page shows its outcome when it "
        "ends. Try again in a few seconds."})


late = _late


def single_tenant(executor: ExecutorLike, token: str) -> Callable[[str], ExecutorLike | None]:
    """``lookup`` for one executor behind one token (constant-time comparison)."""
    import hmac

    expected = token.encode("utf-8")

    def lookup(presented: str) -> ExecutorLike | None:
        ok = hmac.compare_digest(presented.encode("utf-8", "replace"), expected)
        return executor if ok else None

    return lookup
