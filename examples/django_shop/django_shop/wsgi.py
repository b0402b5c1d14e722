"""The shop as a WSGI application, for a WSGI server: `gunicorn django_shop.wsgi`."""

import os

from django.core.wsgi import get_wsgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "django_shop.settings")
application = get_wsgi_application()
