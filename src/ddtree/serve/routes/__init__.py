"""ddtree-serve's routes, one router per concern (create_app includes them in this order)."""

from ddtree.serve.routes import admin, chat, completions, health

ROUTERS = (health.router, admin.router, completions.router, chat.router)
