"""Logging filters of the site's log (``LOGGING`` in ``config.settings``)."""

from __future__ import annotations

import logging


class ClientErrorOneLine(logging.Filter):
    """A refusal of the client's request (a 4xx: 403 for a page someone may not see, 400 for a
    body Django cannot parse) logged by ``django.request`` in one line, without the traceback
    Django attaches: the exception is the access decision, not a fault. Its text, when it has
    one, is kept at the end of the line ("Forbidden (Permission denied): /console/ (The
    console is for operators.)"). A 5xx keeps its traceback."""

    def filter(self, record: logging.LogRecord) -> bool:
        status = getattr(record, "status_code", None)
        if record.exc_info and isinstance(status, int) and 400 <= status < 500:
            detail = str(record.exc_info[1] or "")
            if detail and isinstance(record.args, tuple):
                record.msg = f"{record.msg} (%s)"
                record.args = (*record.args, detail)
            record.exc_info = None
            record.exc_text = None
        return True
