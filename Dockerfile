# The one hetplan image every docker-compose service runs: Airflow's image plus hetplan, its DAGs and plugins.
# Built once (`docker compose build`), so no container installs anything at start-up.
FROM apache/airflow:3.3.2-python3.11

USER root
COPY --chown=airflow:0 . /opt/hetplan/src
USER airflow
# Airflow's own pins stay; requirements.txt pins hetplan's set (shared with the development virtualenv).
RUN pip install --no-cache-dir "apache-airflow==3.3.2" -r /opt/hetplan/src/requirements.txt /opt/hetplan/src \
    && pip install --no-cache-dir "psycopg2-binary>=2.9"
ENV AIRFLOW__CORE__DAGS_FOLDER=/opt/hetplan/src/dags \
    AIRFLOW__CORE__PLUGINS_FOLDER=/opt/hetplan/src/plugins
