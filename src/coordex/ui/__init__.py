"""The page that shows a person the sessions and the call log (SPEC section 11):
``app`` (the handler), ``server`` (a thread for ``serve_ui``), ``asgi`` (for ``serve``)."""

from .app import UIApp, single_tenant

__all__ = ["UIApp", "single_tenant"]
