# The local stand-in for the official python:3.11-slim (scripts/local-base-image.sh). Debian's
# python3 is externally managed (PEP 668) and has neither `pip` nor `python`: a venv on the PATH
# gives both, so the flexgate Dockerfile runs unchanged on either base.
FROM debian:bookworm-slim
RUN apt-get update && apt-get install -y --no-install-recommends python3 python3-venv \
    && rm -rf /var/lib/apt/lists/* \
    && python3 -m venv /usr/local/python
ENV PATH=/usr/local/python/bin:$PATH
CMD ["python3"]
