"""Reports what a handler can observe of its process: cwd, relative files, PYTHONPATH, sys.path.

TorchServe's Hugging Face handler checks ``os.path.isfile("vocab.txt")`` to use the archive's own
vocabulary; this one answers the same check, and reads the file by its relative path.
"""

import os
import sys
import tempfile


def handle(data, context):
    if data is None:
        return None
    vocab = None
    if os.path.isfile("vocab.txt"):
        with open("vocab.txt", encoding="utf-8") as f:
            vocab = f.read().split()
    facts = {
        "cwd": os.getcwd(),
        "model_dir": context.system_properties["model_dir"],
        "vocab": vocab,
        "pythonpath": os.environ.get("PYTHONPATH", "").split(os.pathsep),
        "sys_path": sys.path,
        "tempdir": tempfile.gettempdir(),
    }
    return [facts for _ in data]
