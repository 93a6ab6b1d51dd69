# The one hetplan image every hetplan service of docker-compose.yaml runs: Airflow's image plus hetplan, its
# DAGs and plugins. Built once (`docker compose build`), so no container installs anything at start-up.
FROM apache/airflow:3.3.2-python3.11

USER root
COPY --chown=airflow:0 . /opt/hetplan/src
USER airflow
# Runtime dependencies only: hetplan with its `airflow` extra and docker/image-requirements.txt, every version
# pinned by requirements.txt used as constraints (the set verified with the development virtualenv). The test
# tools and gurobipy are extras (`test`, `gurobi`) the image leaves out.
RUN pip install --no-cache-dir -c /opt/hetplan/src/requirements.txt \
        -r /opt/hetplan/src/docker/image-requirements.txt "/opt/hetplan/src[airflow]"
ENV AIRFLOW__CORE__DAGS_FOLDER=/opt/hetplan/src/dags \
    AIRFLOW__CORE__PLUGINS_FOLDER=/opt/hetplan/src/plugins
