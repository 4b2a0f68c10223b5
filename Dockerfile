# One image for every slotrunner process of compose.yaml (tool server, worker,
# detector, Flower). git for the slots' work trees, bubblewrap for the sandbox of
# run_tests, exec and environment builds (README "Running on several hosts").
FROM python:3.11-slim
RUN apt-get update \
    && apt-get install -y --no-install-recommends git bubblewrap \
    && rm -rf /var/lib/apt/lists/*
WORKDIR /src
COPY . /src
# flower: `celery -A runner.celery_app flower`, the pool's dashboard
RUN pip install --no-cache-dir . flower
ENV SLOTRUNNER_HOME=/var/lib/slotrunner PYTHONUNBUFFERED=1
WORKDIR /var/lib/slotrunner
