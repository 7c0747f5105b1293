# The certflow worker (Temporal workers + HTTP-01 responder).
FROM python:3.11-slim
WORKDIR /app
COPY pyproject.toml README.md ./
COPY certflow certflow
COPY workflows workflows
COPY activities activities
COPY worker.py starter.py ./
# Workflow runs are re-imported into a sandbox each time: ship bytecode (the
# image runs as nobody, which could not write it).
RUN pip install --no-cache-dir . && python -m compileall -q /app
USER nobody
EXPOSE 5002
CMD ["python", "-m", "worker"]
