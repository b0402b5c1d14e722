"""The shop's settings: one PostgreSQL database (SHOP_DATABASE, a postgresql:// URL) holds
Django's tables and, beside them, stepwarden's (STEPWARDEN["store"], read by `tasks.py`)."""

import os
from urllib.parse import unquote, urlsplit

DATABASE_URL = os.environ.get("SHOP_DATABASE", "postgresql://postgres@127.0.0.1:5432/django_shop")
_url = urlsplit(DATABASE_URL)
DATABASES = {
    "default": {
        "ENGINE": "django.db.backends.postgresql",
        "NAME": _url.path.lstrip("/"),
        "USER": unquote(_url.username or ""),
        "PASSWORD": unquote(_url.password or ""),
        "HOST": _url.hostname or "",
        "PORT": str(_url.port or ""),
    }
}
STEPWARDEN = {"store": DATABASE_URL}

SECRET_KEY = os.environ.get("DJANGO_SECRET_KEY", "an-example-key-set-your-own")
DEBUG = False
ALLOWED_HOSTS = ["localhost", "127.0.0.1"]
INSTALLED_APPS = ["django_shop"]
MIDDLEWARE: list[str] = []  # a JSON API without sessions: no CSRF to check
ROOT_URLCONF = "django_shop.urls"
USE_TZ = True
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"
