#!/usr/bin/env bash
# Benchmark of leda-httpd against nginx (static files, Lua page) and Apache mod_lua
# (Lua page), with wrk on loopback. Not run in CI.
#
#   examples/http/bench.sh                 # THREADS=$(nproc) ROUNDS=3 DURATION=5s
#   THREADS=4 ROUNDS=1 DURATION=10s CONNS="50 200" examples/http/bench.sh
#   CASES=dynamic examples/http/bench.sh   # only the Lua page (CASES="static dynamic")
#   PIN=1 examples/http/bench.sh           # servers on the first half of the CPUs, wrk on the rest
#
# leda-httpd is built twice: with LuaJIT (`--no-default-features --features luajit`,
# LuaJIT built with -DLUAJIT_ENABLE_CHECKHOOK so that compiled pages can still be
# stopped at cgi_timeout) as `ours`, and with the default Lua 5.4 as `ours_lua54`
# (dynamic page only). Static files are served by the LuaJIT build (no Lua involved).
#
# Installs wrk, nginx, libnginx-mod-http-lua and apache2 with apt (as root), configures
# each peer in a temporary directory with as many workers as our threads (nginx:
# worker_processes, sendfile on; Apache: event MPM, one process per thread), and runs:
#   static 300 KB and 5 MB files at each connection count: ours (leda-httpd's default
#   flags: files up to --cache-max-file, 8 MiB, from the memory cache) and ours_sendfile (every
#   file kept open by the cache and sent with sendfile: --cache-max-file 0) vs nginx;
#   the thesis' Listing B.1 page (30,000-iteration Lua loop): ours (LuaJIT), ours_lua54,
#   nginx+lua (LuaJIT) and Apache+mod_lua (Lua 5.3).
# By default wrk shares every CPU with the server, as a user's client on the same machine
# would; PIN=1 pins the servers (`taskset`) to the first half of the CPUs and wrk to the
# other half (THREADS and WRK_THREADS then default to those halves; leda-httpd's default
# thread count follows its CPU affinity, so it still runs without --threads).
# Servers are measured alternately, ROUNDS times after a warm-up, each on an idle machine
# (`settle` waits for the previous server's leftover work to finish); the median round is
# printed as
#   BENCH http-<case>-c<conns> unit=req/s better=higher ours=... [ours_sendfile=...] [ours_lua54=...] nginx=... [apache=...]
# followed by p99 latency (ms: the median round's, then every round's) and error counts
# (socket errors + non-2xx) per server.
set -euo pipefail
cd "$(dirname "$0")/../.."

PIN=${PIN:-0}
NCPU=$(nproc)
SRV=() CLI=()
if [ "$PIN" = 1 ]; then
  [ "$NCPU" -ge 2 ] || { echo "bench: PIN=1 needs at least 2 CPUs" >&2; exit 1; }
  SRV_N=$((NCPU / 2))
  SRV=(taskset -c "0-$((SRV_N - 1))") CLI=(taskset -c "$SRV_N-$((NCPU - 1))")
  THREADS=${THREADS:-$SRV_N}
  WRK_THREADS=${WRK_THREADS:-$((NCPU - SRV_N))}
else
  SRV_N=$NCPU
fi
THREADS=${THREADS:-$NCPU}
ROUNDS=${ROUNDS:-3}
DURATION=${DURATION:-5s}
WARMUP=${WARMUP:-2s}
CONNS=${CONNS:-"50 100 200 1000"}
DYN_CONNS=${DYN_CONNS:-"50 200"}
WRK_THREADS=${WRK_THREADS:-$NCPU}
CASES=${CASES:-"static dynamic"}
P_OURS=18080 P_NGINX=18081 P_APACHE=18082 P_OURS54=18083 P_OURSSF=18084

need=()
for p in wrk nginx libnginx-mod-http-lua apache2; do
  dpkg -s "$p" >/dev/null 2>&1 || need+=("$p")
done
if [ ${#need[@]} -gt 0 ]; then
  apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need[@]}" >/dev/null
fi
# Debian starts the packaged services on install: stop them, we run our own instances.
(service nginx stop; service apache2 stop) >/dev/null 2>&1 || true

WORK=$(mktemp -d /tmp/leda-http-bench.XXXXXX)
PIDS=()
cleanup() {
  local all=("${PIDS[@]}") p
  [ -f "$WORK/nginx.pid" ] && all+=("$(cat "$WORK/nginx.pid")")
  [ -f "$WORK/apache.pid" ] && all+=("$(cat "$WORK/apache.pid")")
  for p in "${all[@]}"; do kill "$p" 2>/dev/null || true; done
  # Wait (up to 10 s) for the servers to exit: Apache's children take a moment.
  for _ in $(seq 1 100); do
    local alive=0
    for p in "${all[@]}"; do kill -0 "$p" 2>/dev/null && alive=1; done
    pgrep -f "apache2 -f $WORK/" >/dev/null && alive=1
    [ $alive = 0 ] && break
    sleep 0.1
  done
  rm -rf "$WORK"
}
trap cleanup EXIT
# Both flavours build to target/release/leda-httpd: each is copied out after its build.
cargo build --release -q -p leda-http --bin leda-httpd
cp target/release/leda-httpd "$WORK/leda-httpd-lua54"
CFLAGS="${CFLAGS:-} -DLUAJIT_ENABLE_CHECKHOOK" \
  cargo build --release -q -p leda-http --no-default-features --features luajit --bin leda-httpd
cp target/release/leda-httpd "$WORK/leda-httpd-luajit"
chmod 755 "$WORK"
mkdir -p "$WORK/www" "$WORK/logs"
head -c 307200 /dev/urandom > "$WORK/www/300k.bin"
head -c 5242880 /dev/urandom > "$WORK/www/5m.bin"
cp examples/http/site/loop.lua "$WORK/www/loop.lua"
chmod -R a+rX "$WORK"
ulimit -n 65536 2>/dev/null || ulimit -n "$(ulimit -Hn)"

# --- ours -------------------------------------------------------------------------
# leda-httpd's defaults, as a user starts it: --root and --listen only (one thread per
# CPU, a 64 MiB cache of files up to 8 MiB, 10,000 connections, its own file limit
# raised to the hard limit); --threads only when THREADS is not the CPU count.
OURS_FLAGS=()
[ "$THREADS" = "$SRV_N" ] || OURS_FLAGS=(--threads "$THREADS")
for flavour in luajit:$P_OURS lua54:$P_OURS54; do
  "${SRV[@]}" "$WORK/leda-httpd-${flavour%%:*}" --root "$WORK/www" --listen "127.0.0.1:${flavour#*:}" \
    "${OURS_FLAGS[@]}" >"$WORK/logs/ours-${flavour%%:*}.out" 2>&1 &
  PIDS+=($!)
done

# The same LuaJIT build with every file (static cases only) kept open by the cache and
# sent with sendfile(2) (--cache-max-file 0), nginx's way: `ours_sendfile`.
"${SRV[@]}" "$WORK/leda-httpd-luajit" --root "$WORK/www" --listen "127.0.0.1:$P_OURSSF" \
  "${OURS_FLAGS[@]}" --cache-max-file 0 >"$WORK/logs/ours-sendfile.out" 2>&1 &
PIDS+=($!)

# --- nginx (+ lua) ------------------------------------------------------------------
NGX_MODS=/usr/lib/nginx/modules
cat > "$WORK/nginx.conf" <<NGX
load_module $NGX_MODS/ndk_http_module.so;
load_module $NGX_MODS/ngx_http_lua_module.so;
user www-data;
worker_processes $THREADS;
pid $WORK/nginx.pid;
error_log $WORK/logs/nginx-error.log warn;
events { worker_connections 20000; }
http {
  access_log off;
  sendfile on;
  tcp_nopush on;
  keepalive_requests 100000;
  default_type application/octet-stream;
  client_body_temp_path $WORK/nginx-body;
  proxy_temp_path $WORK/nginx-proxy;
  fastcgi_temp_path $WORK/nginx-fastcgi;
  uwsgi_temp_path $WORK/nginx-uwsgi;
  scgi_temp_path $WORK/nginx-scgi;
  lua_code_cache on;
  init_by_lua_block { loop_page = assert(loadfile("$WORK/www/loop.lua")) }
  server {
    listen 127.0.0.1:$P_NGINX;
    root $WORK/www;
    location = /loop.lua {
      default_type text/html;
      content_by_lua_block { ngx.print(loop_page()) }
    }
  }
}
NGX
"${SRV[@]}" nginx -c "$WORK/nginx.conf" -g 'daemon on;'

# --- Apache (event MPM + mod_lua), dynamic page only --------------------------------
AMODS=/usr/lib/apache2/modules
cat > "$WORK/apache_loop.lua" <<ALUA
local page = assert(loadfile("$WORK/www/loop.lua"))
function handle(r)
  r.content_type = "text/html"
  r:puts(page())
  return apache2.OK
end
ALUA
chmod a+r "$WORK/apache_loop.lua"
cat > "$WORK/apache.conf" <<APC
ServerRoot $WORK
ServerName localhost
Listen 127.0.0.1:$P_APACHE
PidFile $WORK/apache.pid
DefaultRuntimeDir $WORK
Mutex file:$WORK default
ErrorLog $WORK/logs/apache-error.log
LogLevel warn
LoadModule mpm_event_module $AMODS/mod_mpm_event.so
LoadModule authz_core_module $AMODS/mod_authz_core.so
LoadModule mime_module $AMODS/mod_mime.so
TypesConfig /etc/mime.types
LoadModule lua_module $AMODS/mod_lua.so
User www-data
Group www-data
StartServers $THREADS
ServerLimit $THREADS
ThreadsPerChild 64
ThreadLimit 64
MaxRequestWorkers $((THREADS * 64))
MinSpareThreads 1
MaxSpareThreads $((THREADS * 64))
MaxConnectionsPerChild 0
KeepAlive On
MaxKeepAliveRequests 0
DocumentRoot $WORK/www
<Directory $WORK/www>
  Require all granted
</Directory>
LuaScope thread
LuaCodeCache stat
LuaMapHandler "^/loop\.lua$" $WORK/apache_loop.lua handle
APC
"${SRV[@]}" apache2 -f "$WORK/apache.conf" -k start

wait_port() {
  for _ in $(seq 1 100); do
    if (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; then return 0; fi
    sleep 0.1
  done
  echo "bench: nothing listens on port $1" >&2
  exit 1
}
wait_port $P_OURS; wait_port $P_OURS54; wait_port $P_OURSSF; wait_port $P_NGINX; wait_port $P_APACHE
for p in $P_OURS $P_OURS54 $P_NGINX $P_APACHE; do
  code=$(curl -s -o /dev/null -w '%{http_code}' "http://127.0.0.1:$p/loop.lua")
  [ "$code" = 200 ] || { echo "bench: port $p answers $code for /loop.lua" >&2; exit 1; }
done
# The LuaJIT build warns (and runs pages interpreted) if LuaJIT lacks the hook check.
if grep -q LUAJIT_ENABLE_CHECKHOOK "$WORK/logs/ours-luajit.out"; then
  echo "bench: the LuaJIT build runs pages with its JIT compiler off:" >&2
  cat "$WORK/logs/ours-luajit.out" >&2
  exit 1
fi

# run_wrk PORT PATH CONNS DURATION -> "req/s p99_ms errors"
run_wrk() {
  local out
  out=$("${CLI[@]}" wrk -t "$WRK_THREADS" -c "$3" -d "$4" --timeout 10s --latency "http://127.0.0.1:$1$2" 2>&1)
  awk '
    /Requests\/sec:/ { rps = $2 }
    /^ *99%/ { v = $2; if (v ~ /us$/) { sub(/us$/, "", v); v /= 1000 } else if (v ~ /ms$/) { sub(/ms$/, "", v) } else if (v ~ /s$/) { sub(/s$/, "", v); v *= 1000 } p99 = v }
    /Socket errors:/ { gsub(/,/, ""); err += $4 + $6 + $8 + $10 }
    /Non-2xx or 3xx responses:/ { err += $5 }
    END { printf "%s %s %d\n", rps, p99, err }' <<<"$out"
}

# settle: waits (at most 20 s) until the machine is idle again (< 10 % of the CPUs busy
# over 200 ms). A server may keep computing after wrk has gone (Apache's mod_lua finishes
# every Lua page it accepted; at 200 connections that is seconds of CPU): without this,
# the next server in the round would be measured beside that tail.
settle() {
  local i a b
  for i in $(seq 1 100); do
    a=$(awk '/^cpu /{ print $2+$3+$4+$7+$8, $2+$3+$4+$5+$6+$7+$8 }' /proc/stat)
    sleep 0.2
    b=$(awk '/^cpu /{ print $2+$3+$4+$7+$8, $2+$3+$4+$5+$6+$7+$8 }' /proc/stat)
    awk -v a="$a" -v b="$b" 'BEGIN { split(a, x, " "); split(b, y, " ");
      t = y[2] - x[2]; exit !(t > 0 && (y[1] - x[1]) / t < 0.10) }' && return 0
  done
}

median() { sort -g | awk '{ v[NR] = $1 } END { print v[int((NR + 1) / 2)] }'; }

# bench CASE PATH CONNS SERVERS...   (SERVERS: name:port)
bench() {
  local case=$1 path=$2 conns=$3; shift 3
  declare -A rps p99 err
  for s in "$@"; do settle; run_wrk "${s#*:}" "$path" "$conns" "$WARMUP" >/dev/null; done
  for _ in $(seq 1 "$ROUNDS"); do
    for s in "$@"; do
      settle
      read -r r p e < <(run_wrk "${s#*:}" "$path" "$conns" "$DURATION")
      rps[${s%%:*}]+="$r "; p99[${s%%:*}]+="$p "; err[${s%%:*}]+="$e "
    done
  done
  local line="BENCH http-$case-c$conns unit=req/s better=higher" extra=""
  for s in "$@"; do
    local n=${s%%:*}
    line+=" $n=$(tr ' ' '\n' <<<"${rps[$n]}" | grep . | median)"
    extra+=" ${n}_p99_ms=$(tr ' ' '\n' <<<"${p99[$n]}" | grep . | median)"
    extra+=" ${n}_p99_ms_rounds=$(tr -s ' ' ',' <<<"${p99[$n]% }")"
    extra+=" ${n}_errors=$(tr ' ' '\n' <<<"${err[$n]}" | grep . | awk '{ s += $1 } END { print s }')"
  done
  echo "$line"
  echo "  latency/errors http-$case-c$conns:$extra"
}

echo "# $(nproc) CPUs: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs); threads=$THREADS wrk_threads=$WRK_THREADS pin=$PIN${SRV:+ (servers: ${SRV[*]}; wrk: ${CLI[*]})} rounds=$ROUNDS duration=$DURATION; load: $(cut -d' ' -f1-3 /proc/loadavg)"
echo "# ours = leda-httpd with LuaJIT, ours_lua54 = leda-httpd with Lua 5.4 (default build),"
echo "# ours_sendfile = ours with --cache-max-file 0 (every file sent with sendfile from an open descriptor)"
if [[ " $CASES " == *" static "* ]]; then
  for c in $CONNS; do
    bench static300k /300k.bin "$c" ours:$P_OURS ours_sendfile:$P_OURSSF nginx:$P_NGINX
  done
  for c in $CONNS; do
    bench static5m /5m.bin "$c" ours:$P_OURS ours_sendfile:$P_OURSSF nginx:$P_NGINX
  done
fi
if [[ " $CASES " == *" dynamic "* ]]; then
  for c in $DYN_CONNS; do
    bench dynamic /loop.lua "$c" ours:$P_OURS ours_lua54:$P_OURS54 nginx:$P_NGINX apache:$P_APACHE
  done
fi
echo "# load after: $(cut -d' ' -f1-3 /proc/loadavg)"
