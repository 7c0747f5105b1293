# The certflow worker (Temporal workers + HTTP-01 responder), from `pip install .`:
# the wheel carries certflow without its dev harness (devstack/) and without the
# `dev` extra (a Temporal dev server, an embedded Postgres).
FROM python:3.11-slim AS build
WORKDIR /src
COPY pyproject.toml README.md ./
COPY certflow certflow
COPY workflows workflows
COPY activities activities
COPY worker.py ./
RUN pip wheel --no-cache-dir --no-deps --wheel-dir /wheels .

FROM python:3.11-slim AS production
COPY --from=build /wheels /wheels
# Workflow runs are re-imported into a sandbox each time: ship bytecode (the
# image runs as nobody, which could not write it).
RUN pip install --no-cache-dir /wheels/*.whl && rm -rf /wheels \
    && python -m compileall -q "$(python -c 'import sysconfig; print(sysconfig.get_path("purelib"))')"
USER nobody
EXPOSE 5002
CMD ["python", "-m", "worker"]

# docker-compose's dev profile only: Pebble's TLS files, made by the dev harness
# from the source tree (never part of the production image).
FROM build AS dev-tools
COPY devstack devstack
RUN pip install --no-cache-dir .
