# The MLflow tracking server of docker-compose.yaml: MLflow's image plus its Postgres driver and its basic-auth
# app's CSRF package (Flask-WTF, mlflow[auth]), built in once, so the server installs nothing when it starts (no
# internet needed at start-up), and the basic-auth settings. Keep the tag in step with requirements.txt's mlflow
# pin (tests/test_deploy.py checks it).
FROM ghcr.io/mlflow/mlflow:v3.17.2
RUN pip install --no-cache-dir "psycopg2-binary==2.9.13" "Flask-WTF==1.3.0"
COPY mlflow_basic_auth.ini /etc/mlflow/basic_auth.ini
