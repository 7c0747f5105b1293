# The certflow worker (Temporal workers + HTTP-01 responder).
FROM python:3.11-slim
WORKDIR /app
COPY pyproject.toml README.md ./
COPY certflow certflow
COPY workflows workflows
COPY activities activities
COPY worker.py starter.py ./
RUN pip install --no-cache-dir .
USER nobody
EXPOSE 5002
CMD ["python", "-m", "worker"]
