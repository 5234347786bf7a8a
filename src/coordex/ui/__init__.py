"""The page for a person watching an agent work (SPEC section 11): ``app`` (the handler:
routing, the tenant's own threads), ``api`` (the JSON API under ``/ui/api/``),
``access`` (Host/Origin checks and the browser's keys), ``server`` (a thread for
``serve_ui``), ``asgi`` (for ``serve``), and ``page.html`` (the page, its only client)."""

from .app import UIApp, single_tenant

__all__ = ["UIApp", "single_tenant"]
