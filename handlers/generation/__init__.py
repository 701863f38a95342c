"""The generative engine a worker runs for the ``text_generation`` handler (docs/generation.md).

``engine`` (the step), ``scheduler`` (admission, chunked prefill), ``cache`` (the batch's KV
cache), ``sampling`` (token choice), ``detokenize`` (text and stop strings), ``params`` (request
checks), ``loading`` (model, tokenizer and limits from an archive). Importing this package imports
nothing heavy; ``engine``, ``cache``, ``sampling`` and ``loading`` need torch (and transformers).
"""
