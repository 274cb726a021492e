#!/usr/bin/env bash
# Builds the e2e control-plane binaries from the Go modules pinned beside this
# script (one module per tool family, go.mod + go.sum committed), into a cache
# outside the repository keyed by version:
#
#   ${HISPARSE_CACHE:-$HOME/.cache/hisparse}/tools/<family>-<version>/bin/
#
# Usage:
#   e2e/tools/build.sh [FAMILY...]           build whatever is missing or stale
#   e2e/tools/build.sh --print-env           print HISPARSE_*_BIN=<dir> lines; builds nothing
#   e2e/tools/build.sh --check [FAMILY...]   exit 1 (naming what is missing) unless all are built
#
# FAMILY limits the command to those families (default: all). A binary named
# c:<path> is built from a C file of the pinned module (the pause container's
# init, static, with the system C compiler) instead of a Go package.
#
# A family is rebuilt only when its go.mod, go.sum, link flags or Go version
# change (recorded in a stamp file), so a second run takes seconds.
# Environment: HISPARSE_CACHE (cache root), HISPARSE_BUILD_JOBS (go build -p,
# default 2), HISPARSE_BUILD_LANES (families built at once, default 2),
# HISPARSE_BUILD_NICE (niceness, default 15).
set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
TOOLS_CACHE="${HISPARSE_CACHE:-$HOME/.cache/hisparse}/tools"

# family | module dir | pinned module | binary=package ...
# The real node's kubelet, kube-proxy and pause come from the control plane's
# module; CoreDNS is its cluster DNS.
FAMILIES=(
  "etcd|etcd|go.etcd.io/etcd/server/v3|etcd=go.etcd.io/etcd/server/v3"
  # Helm early: scripts/test's chart tests wait for it while the rest compiles.
  "helm|helm|helm.sh/helm/v3|helm=helm.sh/helm/v3/cmd/helm"
  "kubernetes|k8s|k8s.io/kubernetes|kube-apiserver=k8s.io/kubernetes/cmd/kube-apiserver kube-controller-manager=k8s.io/kubernetes/cmd/kube-controller-manager kube-scheduler=k8s.io/kubernetes/cmd/kube-scheduler kubectl=k8s.io/kubernetes/cmd/kubectl kubelet=k8s.io/kubernetes/cmd/kubelet kube-proxy=k8s.io/kubernetes/cmd/kube-proxy pause=c:build/pause/linux/pause.c"
  "coredns|coredns|github.com/coredns/coredns|coredns=github.com/coredns/coredns"
  "kwok|kwok|sigs.k8s.io/kwok|kwok=sigs.k8s.io/kwok/cmd/kwok"
  "lws|lws|sigs.k8s.io/lws|lws-manager=sigs.k8s.io/lws/cmd"
  # llm-d: the EPP (cgo; see llmd_* below) and the ext_proc client that stands in for Envoy; the
  # routing sidecar from a module of its own, at the release whose SSRF guard sees InferencePool v1.
  "llmd|llmd|github.com/llm-d/llm-d-inference-scheduler|epp=github.com/llm-d/llm-d-inference-scheduler/cmd/epp envoy-standin=hisparse.dev/e2e/tools/llmd/cmd/envoy-standin"
  "llmd_sidecar|llmd/sidecar|github.com/llm-d/llm-d-inference-scheduler|pd-sidecar=github.com/llm-d/llm-d-inference-scheduler/cmd/pd-sidecar"
  # The Prometheus Operator and the config reloader it runs beside Prometheus on the real node.
  # Prometheus itself, at the release the operator's module requires (Debian's lacks Kubernetes discovery).
  "prometheus|prometheus|github.com/prometheus/prometheus|prometheus=github.com/prometheus/prometheus/cmd/prometheus"
  "prometheus_operator|prometheus-operator|github.com/prometheus-operator/prometheus-operator|prometheus-operator=github.com/prometheus-operator/prometheus-operator/cmd/operator prometheus-config-reloader=github.com/prometheus-operator/prometheus-operator/cmd/prometheus-config-reloader"
  # The real node's NetworkPolicy enforcer: kube-router in firewall mode only (iptables and ipsets).
  "kube_router|kube-router|github.com/cloudnativelabs/kube-router/v2|kube-router=github.com/cloudnativelabs/kube-router/v2/cmd/kube-router"
)

die() { echo "build.sh: $*" >&2; exit 1; }

# The version a tools module pins for a module, read from go.mod (no network).
pinned_version() { # moddir module
  awk -v m="$2" '$1 == m && $2 ~ /^v/ { print $2; exit }' "$HERE/$1/go.mod"
}

bin_dir() { # family moddir module
  local v; v=$(pinned_version "$2" "$3")
  [[ -n "$v" ]] || die "$HERE/$2/go.mod does not require $3"
  echo "$TOOLS_CACHE/$1-$v/bin"
}

# Version strings are linked in, or the binaries report v0.0.0 and version
# checks (Helm kubeVersion, kubectl skew warnings) misbehave.
ldflags() { # family moddir module
  local family=$1 moddir=$2 module=$3 v
  v=$(pinned_version "$moddir" "$module")
  case "$family" in
    kubernetes)
      # buildDate is the module's publish time, so the build is reproducible.
      local date major minor out=()
      date=$(cd "$HERE/$moddir" && go list -m -f '{{.Time.UTC.Format "2006-01-02T15:04:05Z"}}' "$module")
      major=${v#v}; major=${major%%.*}
      minor=${v#v*.}; minor=${minor%%.*}
      for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
        # The module zip carries no commit id; an empty one beats "$Format:%H$".
        out+=("-X $pkg.gitVersion=$v" "-X $pkg.gitMajor=$major" "-X $pkg.gitMinor=$minor"
              "-X $pkg.gitCommit=" "-X $pkg.gitTreeState=clean" "-X $pkg.buildDate=$date")
      done
      echo "-s -w ${out[*]}" ;;
    etcd)
      # etcd's version is a constant in go.etcd.io/etcd/api/v3/version.
      echo "-s -w" ;;
    kwok)
      echo "-s -w -X sigs.k8s.io/kwok/pkg/consts.Version=$v" ;;
    lws)
      echo "-s -w -X sigs.k8s.io/lws/pkg/version.GitVersion=$v -X sigs.k8s.io/lws/pkg/version.GitCommit=" ;;
    llmd|llmd_sidecar)
      # The EPP reports the inference extension's version variables, the sidecar its own.
      echo "-s -w -X sigs.k8s.io/gateway-api-inference-extension/version.BuildRef=$v" \
        "-X sigs.k8s.io/gateway-api-inference-extension/version.CommitSHA=" \
        "-X github.com/llm-d/llm-d-inference-scheduler/pkg/sidecar/version.BuildRef=$v" \
        "-X github.com/llm-d/llm-d-inference-scheduler/pkg/sidecar/version.CommitSHA=" ;;
    prometheus)
      # Prometheus 3.M.P is published as the Go module version v0.3MM.P (no web UI assets: the API only).
      local pkg=github.com/prometheus/common/version minor=${v#v0.}; minor=${minor%%.*}
      echo "-s -w -X $pkg.Version=$((minor / 100)).$((minor % 100)).${v##*.} -X $pkg.Revision= -X $pkg.Branch=" \
        "-X $pkg.BuildUser= -X $pkg.BuildDate=" ;;
    prometheus_operator)
      # Both report prometheus/common's version variables, as upstream's Makefile links them (no "v").
      local pkg=github.com/prometheus/common/version
      echo "-s -w -X $pkg.Version=${v#v} -X $pkg.Revision= -X $pkg.Branch= -X $pkg.BuildUser= -X $pkg.BuildDate=" ;;
    kube_router)
      echo "-s -w -X github.com/cloudnativelabs/kube-router/v2/pkg/version.Version=$v" \
        "-X github.com/cloudnativelabs/kube-router/v2/pkg/version.BuildDate=" ;;
    coredns)
      # CoreDNS's version is a constant in coremain; the module zip carries no commit id.
      echo "-s -w -X github.com/coredns/coredns/coremain.GitCommit=" ;;
    helm)
      # Helm's built-in Capabilities.KubeVersion follows the client-go it links.
      # client-go v0.N.x is Kubernetes 1.N.
      local cg major=1 minor
      cg=$(pinned_version "$moddir" k8s.io/client-go)
      minor=${cg#v0.}; minor=${minor%%.*}
      echo "-s -w -X helm.sh/helm/v3/internal/version.version=$v" \
        "-X helm.sh/helm/v3/internal/version.gitTreeState=clean" \
        "-X helm.sh/helm/v3/pkg/lint/rules.k8sVersionMajor=$major" \
        "-X helm.sh/helm/v3/pkg/lint/rules.k8sVersionMinor=$minor" \
        "-X helm.sh/helm/v3/pkg/chartutil.k8sVersionMajor=$major" \
        "-X helm.sh/helm/v3/pkg/chartutil.k8sVersionMinor=$minor" ;;
    *) die "no link flags for $family" ;;
  esac
}

stamp_of() { # family moddir ldflags bins
  # A module's own Go sources (the llmd family's stand-in for Envoy), the family's native inputs and the
  # C compiler of a c: binary count too.
  { cat "$HERE/$2/go.mod" "$HERE/$2/go.sum"; echo "$3"; go env GOVERSION
    find "$HERE/$2" -name '*.go' -type f | LC_ALL=C sort | xargs -r cat
    [[ "$1" != llmd ]] || llmd_native_inputs
    [[ "$4" != *=c:* ]] || cc --version | head -1; } | sha256sum | cut -d' ' -f1
}

# --- llmd: llm-d's EPP links cgo code (the tokenizers Rust library, libpython, libzmq) ------------

# Debian's Python, so the EPP links the libpython3.11 a Debian bookworm image carries.
LLMD_PYTHON_CONFIG=${HISPARSE_PYTHON_CONFIG:-/usr/bin/python3-config}
TOKENIZERS_MODULE=github.com/daulet/tokenizers

llmd_native_inputs() {
  cat "$(tokenizers_dir)/.stamp" 2>/dev/null; "$LLMD_PYTHON_CONFIG" --ldflags --embed 2>/dev/null
}

llmd_preflight() {
  local missing=()
  [[ -x "$LLMD_PYTHON_CONFIG" ]] || missing+=("python3-dev (no $LLMD_PYTHON_CONFIG)")
  pkg-config --exists libzmq 2>/dev/null || missing+=("libzmq3-dev (pkg-config finds no libzmq)")
  command -v cargo >/dev/null || missing+=("cargo (rustup or Debian's cargo)")
  command -v cc >/dev/null || missing+=("a C compiler (gcc)")
  ((${#missing[@]} == 0)) || die "llmd: the EPP's cgo build needs ${missing[*]}; scripts/setup installs the Debian packages"
}

# libtokenizers.a from the Rust sources in the tokenizers module zip (crates from crates.io), cached
# on its own (tools/tokenizers-<version>/lib), so a change to the llmd module does not rerun cargo.
# The module cache is read-only, so cargo builds in a copy.
tokenizers_dir() {
  echo "$TOOLS_CACHE/tokenizers-$(pinned_version llmd "$TOKENIZERS_MODULE")"
}

llmd_build_tokenizers() {
  local dir src v stamp tmp start=$SECONDS
  v=$(pinned_version llmd "$TOKENIZERS_MODULE")
  dir=$(tokenizers_dir)
  stamp=$({ echo "$v"; rustc --version; } | sha256sum | cut -d' ' -f1)
  if [[ -f "$dir/.stamp" && "$(cat "$dir/.stamp")" == "$stamp" ]]; then
    return 0
  fi
  src=$(cd "$HERE/llmd" && go mod download -json "$TOKENIZERS_MODULE@$v" | awk -F'"' '$2 == "Dir" { print $4 }')
  [[ -d "$src" ]] || die "llmd: go mod download of $TOKENIZERS_MODULE@$v gave no source directory"
  echo "  cargo build --release ($TOKENIZERS_MODULE@$v) -> $dir/lib/libtokenizers.a"
  tmp="$dir.tmp.$$"
  rm -rf "$dir".tmp.*; mkdir -p "$tmp/lib"
  cp -r "$src" "$tmp/src"; chmod -R u+w "$tmp/src"
  (cd "$tmp/src" &&
    CARGO_TARGET_DIR="$tmp/target" CARGO_BUILD_JOBS="${HISPARSE_BUILD_JOBS:-2}" \
      nice -n "${HISPARSE_BUILD_NICE:-15}" cargo build --release --locked --quiet)
  cp "$tmp/target/release/libtokenizers.a" "$tmp/lib/"
  rm -rf "$tmp/src" "$tmp/target"
  echo "$stamp" > "$tmp/.stamp"
  rm -rf "$dir"; mv "$tmp" "$dir"
  echo "  tokenizers: built in $((SECONDS - start))s"
}

# Environment of one `go build`: the EPP with cgo against the tokenizers lib (static, so linked in),
# the rest static binaries.
go_build_env() { # family binary
  if [[ "$1" == llmd && "$2" == epp ]]; then
    echo CGO_ENABLED=1
    echo "CGO_CFLAGS=$("$LLMD_PYTHON_CONFIG" --includes)"
    echo "CGO_LDFLAGS=-L$(tokenizers_dir)/lib $("$LLMD_PYTHON_CONFIG" --ldflags --embed)"
  else
    echo CGO_ENABLED=0
  fi
}


# A static C program from the pinned module (the pause container's init). Its
# version string follows upstream's Makefile: v<TAG>-<module version>.
build_c() { # moddir module version source out
  local moddir=$1 module=$2 v=$3 src=$4 out=$5 dir tag
  command -v cc >/dev/null || die "no C compiler for $src (install Debian's gcc and libc6-dev)"
  dir=$(cd "$HERE/$moddir" && go mod download -json "$module@$v" | sed -n 's/^\t"Dir": "\(.*\)",$/\1/p')
  [[ -f "$dir/$src" ]] || die "$src not found in $module@$v ($dir)"
  tag=$(awk -F'[ ?:=]+' '$1 == "TAG" { print $2; exit }' "$(dirname "$dir/$src")/../Makefile")
  [[ -n "$tag" ]] || die "no TAG in $(dirname "$src")/../Makefile of $module@$v"
  nice -n "${HISPARSE_BUILD_NICE:-15}" cc -Os -Wall -Werror -static -DVERSION="v$tag-$v" -o "$out" "$dir/$src"
}

# Compile-time plugin selection, as upstream documents it (CoreDNS's plugin.cfg, Prometheus's plugins.yml)
# without regenerating anything: each file under a family's _overlay/ (a directory Go ignores) replaces
# the file at the same path in a copy of the pinned module, and the build reads a go.mod that replaces
# the module with that copy (`go build -modfile`; Go refuses overlays of files in its module cache). The
# family's stamp counts the overlay (stamp_of hashes every .go file of the family's directory).
patched_module() { # moddir module out-prefix; prints the -modfile argument (nothing without an overlay)
  local src="$HERE/$1/_overlay" dir f
  [[ -d "$src" ]] || return 0
  dir=$(cd "$HERE/$1" && go mod download -json "$2@$(pinned_version "$1" "$2")" | awk -F'"' '$2 == "Dir" { print $4 }')
  [[ -d "$dir" ]] || die "$1: go mod download of $2 gave no source directory"
  rm -rf "$3.src"; cp -r "$dir" "$3.src"; chmod -R u+w "$3.src"
  while IFS= read -r f; do
    [[ -f "$3.src/${f#"$src"/}" ]] || die "$1: _overlay/${f#"$src"/} replaces no file of $2"
    cp "$f" "$3.src/${f#"$src"/}"
  done < <(find "$src" -type f -name '*.go' | LC_ALL=C sort)
  cp "$HERE/$1/go.sum" "$3.sum"
  { cat "$HERE/$1/go.mod"; echo "replace $2 => $3.src"; } > "$3.mod"
  echo "-modfile=$3.mod"
}

build_family() { # family moddir module bins
  local family=$1 moddir=$2 module=$3 bins=$4 dir flags stamp tmp start
  dir=$(bin_dir "$family" "$moddir" "$module")
  flags=$(ldflags "$family" "$moddir" "$module")
  if [[ "$family" == llmd ]]; then llmd_preflight; llmd_build_tokenizers; fi
  stamp=$(stamp_of "$family" "$moddir" "$flags" "$bins")
  if [[ -f "$dir/.stamp" && "$(cat "$dir/.stamp")" == "$stamp" ]]; then
    echo "$family: up to date in $dir"
    return 0
  fi
  echo "$family: building into $dir"
  start=$SECONDS
  tmp="$dir.tmp.$$"
  rm -rf "$dir".tmp.*; mkdir -p "$tmp"  # also clears what an interrupted build left
  local pair name pkg env_lines modfile patched=()
  modfile=$(patched_module "$moddir" "$module" "$tmp.patched")
  if [[ -n "$modfile" ]]; then patched=("$modfile"); fi
  for pair in $bins; do
    name=${pair%%=*}; pkg=${pair#*=}
    if [[ "$pkg" == c:* ]]; then
      echo "  cc ${pkg#c:} -> $name"
      build_c "$moddir" "$module" "$(pinned_version "$moddir" "$module")" "${pkg#c:}" "$tmp/$name"
      continue
    fi
    echo "  go build $pkg -> $name"
    mapfile -t env_lines < <(go_build_env "$family" "$name")
    (cd "$HERE/$moddir" &&
      env "${env_lines[@]}" GOFLAGS="${GOFLAGS:-} -p=${HISPARSE_BUILD_JOBS:-2}" \
        nice -n "${HISPARSE_BUILD_NICE:-15}" \
        go build -trimpath -buildvcs=false "${patched[@]}" -ldflags "$flags" -o "$tmp/$name" "$pkg")
  done
  rm -rf "$tmp.patched".*
  echo "$stamp" > "$tmp/.stamp"
  rm -rf "$dir"; mv "$tmp" "$dir"
  echo "$family: built in $((SECONDS - start))s"
}

print_env() {
  local spec family moddir module bins path=""
  for spec in "${FAMILIES[@]}"; do
    IFS='|' read -r family moddir module bins <<<"$spec"
    local d; d=$(bin_dir "$family" "$moddir" "$module")
    echo "HISPARSE_${family^^}_BIN=$d"
    path="${path:+$path:}$d"
  done
  echo "HISPARSE_TOOLS_PATH=$path"
}

# The FAMILIES entries named on the command line (all when none is named).
selected() { # family...
  local spec family known=()
  for spec in "${FAMILIES[@]}"; do
    family=${spec%%|*}; known+=("$family")
    if (($# == 0)) || [[ " $* " == *" $family "* ]]; then echo "$spec"; fi
  done
  for family in "$@"; do
    [[ " ${known[*]} " == *" $family "* ]] || die "unknown family '$family' (known: ${known[*]})"
  done
}

check() { # family...
  local spec family moddir module bins missing=0 pair specs
  specs=$(selected "$@") || exit 1
  while IFS= read -r spec; do
    IFS='|' read -r family moddir module bins <<<"$spec"
    local d; d=$(bin_dir "$family" "$moddir" "$module")
    for pair in $bins; do
      if [[ ! -x "$d/${pair%%=*}" ]]; then
        echo "missing: $d/${pair%%=*}" >&2; missing=1
      fi
    done
  done <<<"$specs"
  ((missing == 0)) || die "run e2e/tools/build.sh to build the missing binaries"
}

main() {
  case "${1:-}" in
    --print-env) print_env; return ;;
    --check) shift; check "$@"; return ;;
    -*) die "unknown argument '$1' (use --print-env, --check or family names)" ;;
  esac
  local specs
  specs=$(selected "$@") || exit 1
  command -v go >/dev/null || die "Go is not on PATH (Go >= 1.26 is needed)"
  mkdir -p "$TOOLS_CACHE"
  local spec family moddir module bins start=$SECONDS failed=() lanes=${HISPARSE_BUILD_LANES:-2} done_pid
  local -A lane_family=() family_failed=()
  # Go's build cache grows to about 11 GB over all families, which the machine's disk needs later (the
  # real node's images): unless GOCACHE is set, this run's families share a cache of its own, removed when
  # it ends (another run, such as scripts/test's Helm build beside the background one, has its own). A
  # family rebuilt later (a version bump) compiles from scratch. A killed run's cache goes at the next run.
  local logs own_gocache="" stale
  logs=$(mktemp -d)
  if [[ -z "${GOCACHE:-}" ]]; then
    for stale in "$TOOLS_CACHE"/.go-build.*; do
      [[ ! -d "$stale" ]] || kill -0 "${stale##*.}" 2>/dev/null || rm -rf "$stale"
    done
    own_gocache="$TOOLS_CACHE/.go-build.$$"
    export GOCACHE="$own_gocache"
  fi
  trap "rm -rf '$logs' ${own_gocache:+'$own_gocache'}" EXIT
  # Families build side by side in $lanes lanes: one family's module downloads and single-threaded links
  # leave the cores idle, and the other lane fills them. Each family's output is printed whole when it ends.
  finish_one() {  # its own names: the loop below still holds the next family's
    local ended code
    if wait -n -p done_pid; then code=0; else code=$?; fi
    ended=${lane_family[$done_pid]}; unset "lane_family[$done_pid]"
    cat "$logs/$ended"
    ((code == 0)) || family_failed[$ended]=1
  }
  while IFS= read -r spec; do
    IFS='|' read -r family moddir module bins <<<"$spec"
    while ((${#lane_family[@]} >= lanes)); do finish_one; done
    # A family that fails does not stop the others; the subshell keeps set -e in force inside
    # build_family. One build of a family at a time, so parallel runs do not race.
    (set -e
     if command -v flock >/dev/null; then exec 9>"$TOOLS_CACHE/.build-$family.lock"; flock 9; fi
     build_family "$family" "$moddir" "$module" "$bins") >"$logs/$family" 2>&1 &
    lane_family[$!]=$family
  done <<<"$specs"
  while ((${#lane_family[@]})); do finish_one; done
  # Failures are named in build order (FAMILIES), not in the order their lanes ended: the message must not
  # depend on timing.
  while IFS= read -r spec; do
    family=${spec%%|*}
    [[ -z "${family_failed[$family]:-}" ]] || failed+=("$family")
  done <<<"$specs"
  if ((${#failed[@]})); then
    die "failed to build: ${failed[*]} (see the errors above); the other tools are ready"
  fi
  echo "all tools ready ($((SECONDS - start))s)"
  print_env
}

main "$@"
