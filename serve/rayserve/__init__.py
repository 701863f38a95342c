"""Lantern on Ray Serve: the same archives, handlers and routes as a Ray Serve application.

Imported only when used (``lantern ray ...`` or a Ray Serve config whose ``import_path`` names
`serve.rayserve.app:build_app`); the rest of Lantern never imports Ray. ``plan`` turns archive
settings into deployment options (pure, no Ray), ``app`` holds the deployments, ``command`` the
``lantern ray`` commands.
"""
