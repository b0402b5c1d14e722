"""One request to the Django example through Django's test client, in a process of its own
(Django's settings, and so its database, are the environment's):

    python -m tests.examples.django_client METHOD PATH [JSON_BODY]

prints the answer's status and its JSON body, as one JSON object."""

from __future__ import annotations

import json
import sys

import django
from django.test import Client


def main() -> None:
    method, path, *body = sys.argv[1:]
    django.setup()
    client = Client(HTTP_HOST="localhost")
    if method == "POST":
        answer = client.post(path, body[0], content_type="application/json")
    else:
        answer = client.get(path)
    print(json.dumps({"status": answer.status_code, "body": answer.json()}))


if __name__ == "__main__":
    main()
