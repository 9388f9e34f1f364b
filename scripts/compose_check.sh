#!/usr/bin/env bash
# docker compose for real (issue #24): build the images without a registry, bring the stack up
# from docker-compose.yml + docker/compose.ci.yml with two train workers, check the security
# model holds (tests/docker/compose_security.py: unsigned requests, Environment injection, a
# second account, Redis), drive it through boto3 (tests/docker/compose_drive.py: a job, an
# endpoint, a worker killed mid-training, postgres and redis restarted mid-job), check
# Prometheus scrapes the API and answers every query of the Grafana dashboard
# (tests/docker/compose_prometheus.py), then take everything down again.
#   bash scripts/compose_check.sh
# Needs root: it installs the engine with apt-get when missing (docker.io, docker-compose,
# debootstrap) and runs its own dockerd on its own socket, data root and exec root under
# /var/tmp (host networking only: no bridge, no iptables rules, no ip_forward change). A
# dockerd it did not start, on the default socket or anywhere else, is never used or touched.
# Cached between runs in $EAGLENEST_DOCKER_CACHE (default ~/.cache/eaglenest/docker): the
# Debian base tarball (debootstrap), the wheelhouses (pip download from the committed locks)
# and dockerd's data root (images and build cache: a rebuild redoes only what changed, and
# no run spends minutes deleting gigabytes). Containers, volumes and dockerd live for one run
# only: a trap takes them down on any exit. One run at a time per cache (flock), and each
# cache has one run dir (/var/tmp/eaglenest-compose-<hash of the cache path>: socket, exec
# root, logs), so a run first clears what a killed run left there: its dockerd (and with it
# its containers), its mounts, its files. The test venv is $EAGLENEST_VENV
# (default .venv; made from requirements/lock.txt if needed).
set -euo pipefail
cd "$(dirname "$0")/.."

if [ "$(id -u)" -ne 0 ]; then
  echo "compose_check: needs root (it starts its own dockerd)" >&2
  exit 2
fi
export PATH="/usr/sbin:/usr/bin:/sbin:/bin:$PATH"  # the engine's own docker client first
CACHE=${EAGLENEST_DOCKER_CACHE:-$HOME/.cache/eaglenest/docker}
PROJECT=eaglenest
COMPOSE_FILES=(-f docker-compose.yml -f docker/compose.ci.yml)
COMPOSE=(docker-compose -p "$PROJECT" "${COMPOSE_FILES[@]}")
PORTS=(5432 6379 9000 8080 9090)  # postgres, redis, S3, API, Prometheus: host networking
mkdir -p "$CACHE"
CACHE=$(cd "$CACHE" && pwd -P)  # as /proc/mounts spells it
exec 9>"$CACHE/lock"
flock -n 9 || { echo "compose_check: another run holds $CACHE/lock" >&2; exit 2; }
# The stack's secrets: random for each run (docker-compose.yml refuses to start without them).
rand() { head -c 12 /dev/urandom | od -An -tx1 | tr -d ' \n'; }
export POSTGRES_PASSWORD="pg$(rand)" MINIO_ROOT_USER="minio$(rand)" MINIO_ROOT_PASSWORD="$(rand)"
export REDIS_PASSWORD="$(rand)"
export EAGLENEST_ACCESS_KEY_ID="AKIA$(rand | tr a-f A-F)" EAGLENEST_SECRET_ACCESS_KEY="$(rand)$(rand)"
export EAGLENEST_METRICS_TOKEN="$(rand)$(rand)"  # the API's /metrics bearer token
export EAGLENEST_JOB_LEASE_SECONDS=${EAGLENEST_JOB_LEASE_SECONDS:-15}  # resume sooner after a kill
# the workers' samples (tau, tokens/s, CPU on /metrics) within seconds of an invocation
export EAGLENEST_METRICS_SAMPLE_SECONDS=${EAGLENEST_METRICS_SAMPLE_SECONDS:-10}
export EAGLENEST_BASE_IMAGE=local/debian:bookworm DOCKER_BUILDKIT=1 COMPOSE_DOCKER_CLI_BUILD=1

# ---- stage timing ---------------------------------------------------------------------------
STAGE="" STAGE_T=$SECONDS TIMES=()
end_stage() {
  if [ -n "$STAGE" ]; then
    TIMES+=("$(printf '  %-34s %5d s' "$STAGE" $((SECONDS - STAGE_T)))")
    STAGE=""
  fi
}
stage() {
  end_stage
  STAGE=$1 STAGE_T=$SECONDS
  echo "== compose_check: $1"
}

# ---- cleanup: on every exit ---------------------------------------------------------------
RUN_ID=$(printf %s "$CACHE" | sha256sum | cut -c1-8)
RUN_DIR=/var/tmp/eaglenest-compose-$RUN_ID
# every container of our dockerd runs under this cgroup (cgroupfs driver), so what a killed
# run left running can be found and killed even when its dockerd and shims are gone
CGROUP=eaglenest-compose-$RUN_ID
RUN_DIR_MADE=0 DOCKERD_PID="" COPIED_WHEELS=0 debootstrap_pid=""
unmount_run_dir() {  # mounts left under the run dir (a dockerd or debootstrap that died)
  grep -o " $RUN_DIR/[^ ]*" /proc/mounts | sort -r | xargs -r -n1 umount -l 2>/dev/null || true
}
kill_cgroup_leftovers() {  # processes left in our containers' cgroups (v1 and v2)
  local dirs procs
  dirs=$(find /sys/fs/cgroup/"$CGROUP" /sys/fs/cgroup/*/"$CGROUP" -maxdepth 0 -type d \
           2>/dev/null || true)
  [ -n "$dirs" ] || return 0
  # shellcheck disable=SC2086
  procs=$(find $dirs -name cgroup.procs -exec cat {} + 2>/dev/null | sort -un | tr '\n' ' ')
  if [ -n "${procs// /}" ]; then
    echo "killing processes left in $CGROUP: $procs"
    # shellcheck disable=SC2086
    kill -KILL $procs 2>/dev/null || true
    sleep 1
  fi
  # shellcheck disable=SC2086
  find $dirs -depth -type d -exec rmdir {} + 2>/dev/null || true
}
clear_stale_run_dir() {
  # what a run of this cache left when it was killed before its trap ran (the flock says no
  # run of this cache is alive): its dockerd, if that pid still is a dockerd of this run dir
  local pid
  pid=$(cat "$RUN_DIR/dockerd.pid" 2>/dev/null || true)
  if [ -n "$pid" ] && tr '\0' ' ' <"/proc/$pid/cmdline" 2>/dev/null \
       | grep -q "^dockerd .*--pidfile $RUN_DIR/dockerd.pid"; then
    echo "stopping dockerd $pid left by a killed run, and its containers"
    DOCKER_HOST="unix://$RUN_DIR/docker.sock" timeout 120 sh -c \
      'docker ps -aq | xargs -r docker rm -f >/dev/null' || true
    kill -TERM "$pid" 2>/dev/null || true
    for _ in $(seq 60); do kill -0 "$pid" 2>/dev/null || break; sleep 0.5; done
    kill -KILL "$pid" 2>/dev/null || true
  fi
  kill_cgroup_leftovers
  unmount_run_dir
  rm -rf "$RUN_DIR"
  # dockerd bind-mounts its data root onto itself and undoes that when it stops; a killed
  # one leaves the bind behind
  if awk -v d="$CACHE/dockerd-data" '$4 == d && $5 == d {f=1} END {exit !f}' \
       /proc/self/mountinfo; then
    umount -l "$CACHE/dockerd-data" || true
  fi
}
remove_all_containers() {  # every container and volume of this dockerd (ours alone)
  docker ps -aq | xargs -r docker rm -f >/dev/null
  docker volume ls -q | xargs -r docker volume rm -f >/dev/null
}
project_containers() {
  docker ps -a --format '{{.Names}}' --filter "label=com.docker.compose.project=$PROJECT"
}
show_container() {  # a container's state and its last log lines
  local name=$1 lines=${2:-40}
  echo "---- $name: $(docker inspect -f '{{.State.Status}} exit={{.State.ExitCode}} restarts={{.RestartCount}}{{if .State.Health}} health={{.State.Health.Status}}{{end}}' "$name" 2>&1)"
  docker logs --tail "$lines" "$name" 2>&1 | cut -c1-400 | sed 's/^/  | /'
  docker inspect -f '{{if .State.Health}}{{range .State.Health.Log}}  healthcheck exit={{.ExitCode}} {{.Output}}
{{end}}{{end}}' "$name" 2>/dev/null | grep -v '^$' | tail -3 | cut -c1-300
}
cleanup() {
  local rc=$?
  set +e
  end_stage
  if [ -n "$DOCKERD_PID" ]; then
    if [ "$rc" -ne 0 ] && docker version >/dev/null 2>&1; then
      echo "== compose_check: FAILED (exit $rc); every container's last log lines:"
      for name in $(project_containers); do show_container "$name" 30; done
    fi
    stage "down -v, stop dockerd"
    "${COMPOSE[@]}" down -v --remove-orphans --timeout 30 >"$RUN_DIR/down.log" 2>&1 \
      || { echo "docker-compose down failed:"; tail -20 "$RUN_DIR/down.log"; }
    remove_all_containers
    # the data root is kept (cache): drop superseded images and build cache beyond 4 GB
    docker image prune -f >/dev/null
    docker builder prune -f --keep-storage 4GB >/dev/null
    kill -TERM "$DOCKERD_PID" 2>/dev/null
    for _ in $(seq 60); do kill -0 "$DOCKERD_PID" 2>/dev/null || break; sleep 0.5; done
    if kill -0 "$DOCKERD_PID" 2>/dev/null; then
      echo "dockerd $DOCKERD_PID did not stop in 30 s: killing it"
      kill -KILL "$DOCKERD_PID" 2>/dev/null
    fi
    wait "$DOCKERD_PID" 2>/dev/null
    kill_cgroup_leftovers
    end_stage
  fi
  if [ -n "$debootstrap_pid" ]; then  # interrupted while debootstrap ran
    kill -TERM -- "-$debootstrap_pid" 2>/dev/null
    wait "$debootstrap_pid" 2>/dev/null
  fi
  if [ "$RUN_DIR_MADE" = 1 ]; then
    unmount_run_dir
    rm -rf "$RUN_DIR"
  fi
  if [ "$COPIED_WHEELS" = 1 ]; then
    find docker/wheelhouse -name '*.whl' -delete
    rm -rf docker/ci/wheelhouse
  fi
  if [ ${#TIMES[@]} -gt 0 ]; then
    echo "== compose_check: stage times"
    printf '%s\n' "${TIMES[@]}"
    printf '  %-34s %5d s\n' total "$SECONDS"
  fi
  [ "$rc" -eq 0 ] && echo "== compose_check: OK" || echo "== compose_check: FAILED (exit $rc)"
  exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# ---- the engine -----------------------------------------------------------------------------
stage "engine; a killed run's leftovers"
clear_stale_run_dir
mkdir -m 0700 "$RUN_DIR"  # fails if anything recreated it meanwhile
RUN_DIR_MADE=1
BASE_TAR=$CACHE/debian-bookworm-minbase.tar
need=()
command -v dockerd >/dev/null || need+=(docker.io)
command -v docker-compose >/dev/null || need+=(docker-compose)
[ -s "$BASE_TAR" ] || command -v debootstrap >/dev/null || need+=(debootstrap)
if [ ${#need[@]} -gt 0 ]; then
  echo "installing ${need[*]}"
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need[@]}" >/dev/null
fi
dockerd --version
docker-compose --version
if DOCKER_HOST=unix:///var/run/docker.sock docker version >/dev/null 2>&1; then
  echo "a dockerd this script did not start serves /var/run/docker.sock: not using it;" \
       "this run has its own socket and data root"
fi

# ---- the test venv (the driver, pip download) ---------------------------------------------
stage "test venv"
# shellcheck source=scripts/_venv.sh
. scripts/_venv.sh
ensure_venv requirements/lock.txt

# ---- cached inputs: the Debian base and the wheelhouses -------------------------------------
stage "base rootfs and wheelhouses (cached)"
# debootstrap (Debian mirror) in the background while pip downloads (PyPI): both cold on a
# fresh machine, both network-bound
if [ -s "$BASE_TAR" ]; then
  echo "cached: $BASE_TAR ($(du -h "$BASE_TAR" | cut -f1))"
else
  mirror=$(grep -hE '^[[:space:]]*(URIs:|deb )' /etc/apt/sources.list \
             /etc/apt/sources.list.d/* 2>/dev/null | grep -oE 'https?://[^ ]+/debian/?' \
           | head -1 || true)
  mirror=${mirror:-http://deb.debian.org/debian}
  echo "debootstrap --variant=minbase bookworm from $mirror"
  setsid debootstrap --variant=minbase bookworm "$RUN_DIR/rootfs" "$mirror" \
    >"$RUN_DIR/debootstrap.log" 2>&1 9>&- &
  debootstrap_pid=$!  # its own process group: the trap stops all of it
fi

key=$(cat requirements/service.txt requirements/lock.txt | sha256sum | cut -c1-16)
WHEELS=$CACHE/wheelhouse-$key
if [ -f "$WHEELS/.complete" ]; then
  echo "cached: $WHEELS"
else
  rm -rf "$WHEELS"
  mkdir -p "$WHEELS/service" "$WHEELS/s3"
  dl=(_quiet_pip "$PY" -m pip download -q --disable-pip-version-check --only-binary=:all:)
  # the image's packages: service.txt exactly (torch's CPU build: local wheel or PyTorch's index)
  torch_pin=$(grep -E '^torch==' requirements/service.txt)
  "${dl[@]}" --no-deps -d "$WHEELS/service" "$torch_pin" 2>/dev/null \
    || "${dl[@]}" --no-deps -d "$WHEELS/service" --index-url https://download.pytorch.org/whl/cpu \
         "$torch_pin"
  "${dl[@]}" --no-deps -d "$WHEELS/service" -r <(grep -vE '^(torch==|#)' requirements/service.txt)
  # CI's S3 (moto_server): moto[server] and its dependencies, at the dev lock's versions
  "${dl[@]}" -d "$WHEELS/s3" -c <(grep -v '^#' requirements/lock.txt) 'moto[server]'
  touch "$WHEELS/.complete"
fi

if [ -n "$debootstrap_pid" ]; then
  wait "$debootstrap_pid" || { debootstrap_pid=""; tail -20 "$RUN_DIR/debootstrap.log"; exit 1; }
  debootstrap_pid=""
  tar -C "$RUN_DIR/rootfs" -c . >"$BASE_TAR.tmp"
  mv "$BASE_TAR.tmp" "$BASE_TAR"
  rm -rf "$RUN_DIR/rootfs"
fi
find "$CACHE" -maxdepth 1 -name 'wheelhouse-*' ! -path "$WHEELS" -exec rm -rf {} +
COPIED_WHEELS=1
find docker/wheelhouse -name '*.whl' -delete
rm -rf docker/ci/wheelhouse && mkdir -p docker/ci/wheelhouse
cp -l "$WHEELS"/service/*.whl docker/wheelhouse/ 2>/dev/null || cp "$WHEELS"/service/*.whl docker/wheelhouse/
cp -l "$WHEELS"/s3/*.whl docker/ci/wheelhouse/ 2>/dev/null || cp "$WHEELS"/s3/*.whl docker/ci/wheelhouse/
echo "$(ls docker/wheelhouse/*.whl | wc -l) wheels for the image ($(du -shL docker/wheelhouse | cut -f1))," \
     "$(ls docker/ci/wheelhouse/*.whl | wc -l) for moto_server"

# ---- our own dockerd ------------------------------------------------------------------------
stage "dockerd"
echo '{}' >"$RUN_DIR/daemon.json"
dockerd --config-file "$RUN_DIR/daemon.json" --data-root "$CACHE/dockerd-data" \
  --exec-root "$RUN_DIR/exec" --pidfile "$RUN_DIR/dockerd.pid" -H "unix://$RUN_DIR/docker.sock" \
  --containerd-namespace eaglenest-ci --containerd-plugins-namespace eaglenest-ci-plugins \
  --bridge=none --iptables=false --ip-forward=false --ip-masq=false \
  --exec-opt native.cgroupdriver=cgroupfs --cgroup-parent "$CGROUP" \
  >"$RUN_DIR/dockerd.log" 2>&1 9>&- &  # no flock fd: an orphaned dockerd must not hold it
DOCKERD_PID=$!
export DOCKER_HOST="unix://$RUN_DIR/docker.sock"
for _ in $(seq 120); do
  docker version >/dev/null 2>&1 && break
  kill -0 "$DOCKERD_PID" 2>/dev/null || { tail -20 "$RUN_DIR/dockerd.log"; exit 1; }
  sleep 0.5
done
docker version --format 'dockerd {{.Server.Version}} (pid '"$DOCKERD_PID"') on '"$DOCKER_HOST"
remove_all_containers  # left by a run that was killed before its trap ran

stage "import base image"
# imported once per tarball: the label says which one
base_id="$(stat -c '%s-%Y' "$BASE_TAR")"
if [ "$(docker image inspect -f '{{index .Config.Labels "eaglenest.base"}}' local/debian:bookworm \
        2>/dev/null)" = "$base_id" ]; then
  echo "cached: local/debian:bookworm ($base_id)"
else
  docker import --change "LABEL eaglenest.base=$base_id" "$BASE_TAR" local/debian:bookworm >/dev/null
fi

# ---- build and start ------------------------------------------------------------------------

stage "build images"
# migrate builds eaglenest/eaglenest for api and the workers too (same image and build)
"${COMPOSE[@]}" build --parallel --progress plain postgres redis minio prometheus migrate \
  >"$RUN_DIR/build.log" 2>&1 || { tail -60 "$RUN_DIR/build.log"; exit 1; }
docker images --filter dangling=false --format '  {{.Repository}}:{{.Tag}}  {{.Size}}' | sort

stage "up -d (2 train workers)"
for port in "${PORTS[@]}"; do
  if (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null; then
    echo "127.0.0.1:$port is taken: the stack's services need ${PORTS[*]} (host networking)" >&2
    exit 1
  fi
done
"${COMPOSE[@]}" up -d --no-build --scale worker-train=2

stage "wait for healthchecks"
# Every container: running and healthy (a worker: and its Celery node ready), or a one-shot
# (migrate, create-buckets) exited 0. An unhealthy container, a one-shot that failed or a
# container that restarted fails the run at once, with its last log lines.
deadline=$((SECONDS + 600))
while :; do
  pending=() failed=()
  for name in $(project_containers); do
    read -r status code health restarts < <(docker inspect -f \
      '{{.State.Status}} {{.State.ExitCode}} {{if .State.Health}}{{.State.Health.Status}}{{else}}none{{end}} {{.RestartCount}}' "$name")
    if [ "$status" = exited ]; then  # a one-shot: its exit status is all that counts
      [ "$code" = 0 ] || failed+=("$name")
    elif [ "$restarts" != 0 ] || [ "$health" = unhealthy ]; then
      failed+=("$name")
    elif [ "$health" != healthy ]; then
      pending+=("$name")
    elif [[ $name == *_worker-* ]] && ! docker logs "$name" 2>&1 | grep -q ' ready\."'; then
      # host networking: every worker's Celery node is eaglenest-1@<this host>, so a worker's
      # healthcheck also passes while another answers; its own ready line decides
      pending+=("$name")
    fi
  done
  if [ ${#failed[@]} -gt 0 ]; then
    echo "failed its healthcheck, exited non-zero or restarted: ${failed[*]}" >&2
    for name in "${failed[@]}"; do show_container "$name"; done
    exit 1
  fi
  [ ${#pending[@]} -eq 0 ] && break
  if [ "$SECONDS" -gt "$deadline" ]; then
    echo "not healthy after 600 s: ${pending[*]}" >&2
    for name in "${pending[@]}"; do show_container "$name"; done
    exit 1
  fi
  sleep 2
done
"${COMPOSE[@]}" ps

# ---- drive it -------------------------------------------------------------------------------
stage "security: unsigned, environment, accounts, redis, /metrics"
"$PY" tests/docker/compose_security.py --project "$PROJECT" "${COMPOSE_FILES[@]}"

stage "drive: job, endpoint, kill, restarts"
"$PY" tests/docker/compose_drive.py --project "$PROJECT" "${COMPOSE_FILES[@]}"

stage "prometheus: target, dashboard queries"
"$PY" tests/docker/compose_prometheus.py
end_stage
