#!/usr/bin/env bash
# A Docker engine of its own on this machine (root), for the image tests and for trying docker/.
#
#   tools/local_docker.sh start DIR     # dockerd with its state, sockets and log under DIR
#   DOCKER_HOST=unix://DIR/docker.sock docker build -f docker/Dockerfile.cpu ...
#   tools/local_docker.sh stop DIR      # stops what start started (images stay in DIR/root)
#
# Needs Debian's docker.io package. Its own data root, exec root and socket, so it neither needs
# nor disturbs a system dockerd; it starts its own containerd (dockerd does, when none is given).
set -euo pipefail
action=${1:?usage: local_docker.sh start|stop DIR}
dir=$(realpath -m "${2:?usage: local_docker.sh start|stop DIR}")
sock=$dir/docker.sock

start() {
    [[ $(id -u) == 0 ]] || { echo "local_docker: must run as root" >&2; exit 1; }
    command -v dockerd >/dev/null || { echo "local_docker: dockerd not found (apt-get install docker.io)" >&2; exit 1; }
    mkdir -p "$dir"/{root,exec}
    dockerd --data-root "$dir/root" --exec-root "$dir/exec" --pidfile "$dir/dockerd.pid" \
        --host "unix://$sock" > "$dir/dockerd.log" 2>&1 &
    local deadline=$(( SECONDS + 60 ))
    until DOCKER_HOST=unix://$sock docker version >/dev/null 2>&1; do
        if (( SECONDS > deadline )) || ! kill -0 $! 2>/dev/null; then
            echo "local_docker: dockerd did not come up; its log, $dir/dockerd.log, ends:" >&2
            tail -5 "$dir/dockerd.log" >&2
            stop
            exit 1
        fi
        sleep 0.5
    done
    echo "local_docker: engine up; export DOCKER_HOST=unix://$sock"
}

stop() {
    [[ -f $dir/dockerd.pid ]] || return 0
    local pid; pid=$(cat "$dir/dockerd.pid")
    kill "$pid" 2>/dev/null || true
    # dockerd stops its containers and its containerd before it exits.
    for _ in $(seq 1 60); do kill -0 "$pid" 2>/dev/null || break; sleep 0.5; done
    kill -9 "$pid" 2>/dev/null || true
    rm -f "$dir/dockerd.pid"
    echo "local_docker: stopped"
}

"$action"
