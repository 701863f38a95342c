"""A torch-free handler that writes to the model log.

Body commands: ``boom`` raises ValueError; ``say TEXT`` prints ``TEXT`` to stdout, then logs
``debug TEXT`` at DEBUG, ``info TEXT`` at INFO and ``warn TEXT`` at WARNING. Anything else is
echoed.
"""

import logging

logger = logging.getLogger("log_handler")


def handle(data, context):
    if data is None:
        return None
    out = []
    for row in data:
        body = row.get("body", row.get("data"))
        text = body.decode(errors="replace") if isinstance(body, (bytes, bytearray)) else str(body)
        if text == "boom":
            raise ValueError("boom requested")
        if text.startswith("say "):
            said = text[4:]
            print(said)
            logger.debug("debug %s", said)
            logger.info("info %s", said)
            logger.warning("warn %s", said)
        out.append(text)
    return out
