"""What producers import (the API, the CLI): the Celery app, routing, publishing, the broker
transport, callbacks and ending a queued session. Never the stages (`tasks.worker`)."""
