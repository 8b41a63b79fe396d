#!/usr/bin/env bash
# Create (or update) a Cloud Scheduler job that launches the tensordedup Flex Template on
# Dataflow every day (docs/dataflow.md, step 9). Edit the variables, then run it once with
# gcloud logged in as someone who may create scheduler jobs in the project.
#
# The run id is not in the request (Cloud Scheduler sends a fixed body): the launcher
# takes the launch date in UTC, so each day's run gets its own id and a retried day
# replaces that day's outputs. A launch only submits the job; follow it in the Dataflow
# console or with `gcloud dataflow jobs list --region "$REGION"`.
set -euo pipefail

PROJECT=my-project
REGION=us-central1                               # Dataflow region (GPU quota is per region)
BUCKET=my-tensordedup-bucket
TEMPLATE=gs://$BUCKET/templates/tensordedup.json # written by gcloud dataflow flex-template build
CONFIG=gs://$BUCKET/configs/dedupe-dataflow.yaml # the job's config (runner.name: dataflow)
SCHEDULE="30 2 * * *"                            # cron syntax, in TIME_ZONE
TIME_ZONE=Etc/UTC
SCHEDULER_JOB=tensordedup-daily
DATAFLOW_JOB=tensordedup-daily                   # Dataflow job name (one active at a time)
WORKER_SA=tensordedup-worker@$PROJECT.iam.gserviceaccount.com      # launcher VM and workers
SCHEDULER_SA=tensordedup-scheduler@$PROJECT.iam.gserviceaccount.com  # calls the launch API

URI="https://dataflow.googleapis.com/v1b3/projects/$PROJECT/locations/$REGION/flexTemplates:launch"
BODY=$(cat <<JSON
{
  "launchParameter": {
    "jobName": "$DATAFLOW_JOB",
    "containerSpecGcsPath": "$TEMPLATE",
    "parameters": {"config": "$CONFIG"},
    "environment": {
      "serviceAccountEmail": "$WORKER_SA",
      "tempLocation": "gs://$BUCKET/tmp",
      "stagingLocation": "gs://$BUCKET/staging"
    }
  }
}
JSON
)

common=(
  --project "$PROJECT" --location "$REGION"
  --schedule "$SCHEDULE" --time-zone "$TIME_ZONE"
  --uri "$URI" --http-method POST --message-body "$BODY"
  --oauth-service-account-email "$SCHEDULER_SA"
  --oauth-token-scope https://www.googleapis.com/auth/cloud-platform
  --attempt-deadline 10m
)
if gcloud scheduler jobs describe "$SCHEDULER_JOB" --project "$PROJECT" \
        --location "$REGION" > /dev/null 2>&1; then
  gcloud scheduler jobs update http "$SCHEDULER_JOB" "${common[@]}" \
      --update-headers Content-Type=application/json
else
  gcloud scheduler jobs create http "$SCHEDULER_JOB" "${common[@]}" \
      --headers Content-Type=application/json
fi

echo "scheduled: $SCHEDULER_JOB ($SCHEDULE $TIME_ZONE) launches $TEMPLATE with $CONFIG"
echo "run it now: gcloud scheduler jobs run $SCHEDULER_JOB --project $PROJECT --location $REGION"
