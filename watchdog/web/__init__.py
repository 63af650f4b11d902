"""The coordinator's read-only web view (coordinator process): an HTTP server in threads of its
own that renders jobs, ranks and incidents with `watchdog.report`, for token holders only."""

from watchdog.web.access import WebAuth
from watchdog.web.server import WebSource, WebView, tls_context
from watchdog.web.source import CoordinatorSource

__all__ = ["CoordinatorSource", "WebAuth", "WebSource", "WebView", "tls_context"]
