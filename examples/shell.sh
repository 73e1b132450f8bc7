#!/usr/bin/env bash
# Publish a turn as a JSON line from a shell, then read the history back with the CLI and redis-cli.
#
#   examples/shell.sh [CONVERSATION]     (with the worker's settings: COMPACTION_KAFKA__BOOTSTRAP_SERVERS, ...)
#
# The producer is kafka-python (or aiokafka): kcat and every librdkafka client cannot talk to the
# embedded broker that `compaction-worker run` starts. Against the docker-compose Kafka, kcat works:
#   echo "$CID|$TURN" | kcat -P -b localhost:9092 -t conversation.turn -K'|'
set -euo pipefail
CID=${1:-shell-demo}
REDIS_CLI=${REDIS_CLI:-redis-cli}
REDIS_URL=${COMPACTION_REDIS__URL:-redis://localhost:6379/0}
PREFIX=${COMPACTION_REDIS__KEY_PREFIX:-cw}
export KAFKA=${COMPACTION_KAFKA__BOOTSTRAP_SERVERS:-localhost:9092} TOPIC=${COMPACTION_TOPICS__TURNS:-conversation.turn}

# One turn, one JSON line, keyed by its conversation (kafka-console-producer --property parse.key=true style).
echo "{\"conversation_id\": \"$CID\", \"turn_seq\": 1, \"model\": \"gpt-4o-mini\",
  \"messages\": [{\"role\": \"user\", \"content\": \"hello from a shell\"}]}" | tr -d '\n' | python -c '
import json, os, sys; from kafka import KafkaProducer
p = KafkaProducer(bootstrap_servers=os.environ["KAFKA"])
for line in sys.stdin: p.send(os.environ["TOPIC"], line.encode(), key=json.loads(line)["conversation_id"].encode())
p.flush()'

# The worker stores it within moments: wait for the conversation's last_seq.
for _ in $(seq 100); do
  [ "$("$REDIS_CLI" -u "$REDIS_URL" HGET "$PREFIX:{$CID}:meta" last_seq)" = 1 ] && break
  sleep 0.2
done

compaction-worker conversation history "$CID" --json           # the effective history, as the model gets it
"$REDIS_CLI" -u "$REDIS_URL" LRANGE "$PREFIX:{$CID}:transcript" 0 -1   # the stored transcript records
