#!/usr/bin/env bash
# The layers as a build fact (docs/ARCHITECTURE.md "Layers"; CMakeLists.txt runs this
# script before it compiles the library, target cpc_layers, and ctest runs it as
# cli_layers): a fast standalone check of the source tree, no build needed.
#
# 1. Every quoted #include of a layer's file names a header of its own layer or of a
#    layer it may use (the arrows below); the public API headers (include/cpc) are for
#    api/ and the tools, except the type headers the ir shares with the API
#    (cpc/types.h, cpc/status.h) and cpc/export.h (CPC_API, for the internal
#    declarations of exported functions).  No "../" includes anywhere.
#      ir        compiler/ir                  ir
#      compiler  compiler                     ir, compiler (+ its generated headers)
#      runtime   runtime, runtime/backend,    ir, runtime
#                runtime/transport
#      io        runtime/io                   ir, io (the trace's events: ir's event.h)
#      session   runtime/session              everything above
#      api       api                          everything, include/cpc
#      tool      tool                         everything, include/cpc (cpc/tool.h: the
#                                             static cpc_tool library, not in libcpc.so)
#      tools     tools, examples              <cpc/...> and system headers only
# 2. No hand-declared internal function: a file-scope prototype of a cpc_ function in a
#    .c file (layers, tools, examples) must be defined in that same file (a forward
#    declaration) or be declared by a header; a tool that declares cpc_foo() itself to
#    link it from libcpc.a fails here.
#
#   tests/cli/layers.sh          prove the check catches both kinds of violation (on a
#                                copy with a wrong include and a hand declaration), then
#                                check this tree (exit 1 on a violation): the ctest
#   tests/cli/layers.sh --quick  only check this tree: the build step
set -u
cd "$(dirname "$0")/../.."
ROOT=${CPC_LAYERS_ROOT:-$PWD}

check_tree() {
  local root=$1 bad=0
  # header basename -> layer
  declare -A home
  local d l f h
  for d in compiler/ir:ir compiler:compiler runtime:runtime runtime/backend:runtime \
           runtime/transport:runtime runtime/io:io runtime/session:session api:api tool:tool; do
    l=${d#*:}; d=${d%%:*}
    for f in "$root/$d"/*.h; do [ -e "$f" ] && home[$(basename "$f")]=$l; done
  done
  home[cpc_kernels.h]=compiler
  home[cpc_lua_prelude.h]=compiler
  declare -A may=(
    [ir]="ir"
    [compiler]="ir compiler"
    [runtime]="ir runtime"
    [io]="ir io"
    [session]="ir compiler runtime io session"
    [api]="ir compiler runtime io session api"
    [tool]="ir compiler runtime io session api tool"
  )
  local out
  for d in compiler/ir:ir compiler:compiler runtime:runtime runtime/backend:runtime \
           runtime/transport:runtime runtime/io:io runtime/session:session api:api tool:tool tools:tools examples:tools; do
    l=${d#*:}; d=${d%%:*}
    for f in "$root/$d"/*.c "$root/$d"/*.h; do
      [ -e "$f" ] || continue
      local rel=${f#$root/}
      while IFS= read -r line; do
        local n=${line%%:*} inc=${line#*:}
        inc=$(sed -E 's/^[[:space:]]*#[[:space:]]*include[[:space:]]*//' <<<"$inc")
        local name=${inc:1}; name=${name%[\">]*}
        case "$inc" in
          \"../*|\<../*) echo "layers: $rel:$n: relative include $inc reaches into another layer"; bad=1; continue ;;
        esac
        if [ "$l" = tools ]; then
          case "$inc" in
            \"*) echo "layers: $rel:$n: a tool includes $inc: tools see the public API only (<cpc/...>)"; bad=1 ;;
          esac
          continue
        fi
        case "$inc" in \<*) continue ;; esac   # system and library headers
        if [[ "$name" == cpc/* ]]; then
          if [ "$l" != api ] && [ "$l" != tool ] && [ "$name" != cpc/types.h ] && [ "$name" != cpc/status.h ] &&
             [ "$name" != cpc/export.h ]; then
            echo "layers: $rel:$n: layer $l includes the public API header $name (only api/ and the tools may)"; bad=1
          fi
          continue
        fi
        h=${home[$name]:-}
        if [ -z "$h" ]; then
          echo "layers: $rel:$n: $inc is no header of a layer"; bad=1; continue
        fi
        if [[ " ${may[$l]} " != *" $h "* ]]; then
          echo "layers: $rel:$n: layer $l includes $name of layer $h (it may use: ${may[$l]})"; bad=1
        fi
      done < <(grep -n -E '^[[:space:]]*#[[:space:]]*include' "$f" | sed -E 's/^([0-9]+):/\1:/')
      # hand-declared functions (prototypes at file scope in .c files)
      case "$f" in *.c) ;; *) continue ;; esac
      while IFS= read -r line; do
        local n=${line%%:*} fn
        fn=$(grep -o -E '\bcpc_[a-z0-9_]+[[:space:]]*\(' <<<"${line#*:}" | head -1 | tr -d ' (')
        [ -n "$fn" ] || continue
        # defined here (a forward declaration of a static or local function)?
        if grep -q -E "^[a-z_][a-zA-Z0-9_ *]*\b$fn\([^;]*\)?[[:space:]]*\{?[[:space:]]*$" "$f" &&
           grep -E "^[a-z_][a-zA-Z0-9_ *]*\b$fn\(" "$f" | grep -v -q ';[[:space:]]*$'; then
          continue
        fi
        echo "layers: $rel:$n: $fn is declared by hand (include the header that declares it)"; bad=1
      done < <(grep -n -E '^(extern[[:space:]]+)?(static[[:space:]]+)?(const[[:space:]]+)?[a-z_][a-z0-9_]*[[:space:]*]+cpc_[a-z0-9_]+[[:space:]]*\([^{]*\)[[:space:]]*(__attribute__.*)?;[[:space:]]*$' "$f")
    done
  done
  return $bad
}

if [ "${1:-}" != --quick ]; then
  tmp=$(mktemp -d)
  trap 'rm -rf "$tmp"' EXIT
  cp -r compiler runtime api tool tools examples "$tmp"/ 2>/dev/null
  mkdir -p "$tmp/include" && cp -r include/cpc "$tmp/include/"
  # a runtime file includes the compiler's verifier; a tool declares an internal function
  sed -i '0,/#include "rank.h"/s//#include "rank.h"\n#include "verify.h"/' "$tmp/runtime/rank.c"
  printf 'cpc_status *cpc_verify(const void *prog);\n' >>"$tmp/tools/cprun.c"
  # io reaches back into the runtime (the edge cut in issue 22: the trace's events are ir's)
  sed -i '0,/#include "trace.h"/s//#include "trace.h"\n#include "executor.h"/' "$tmp/runtime/io/trace.c"
  out=$(check_tree "$tmp")
  grep -q 'runtime/rank.c:.*layer runtime includes verify.h of layer compiler' <<<"$out" &&
    grep -q 'tools/cprun.c:.*cpc_verify is declared by hand' <<<"$out" &&
    grep -q 'runtime/io/trace.c:.*layer io includes executor.h of layer runtime' <<<"$out" || {
    echo "layers.sh: --self-test: the check missed an injected violation:"; echo "$out"; exit 1; }
  echo "layers.sh: self-test: all three injected violations caught"
fi
if ! out=$(check_tree "$ROOT"); then
  echo "$out" >&2
  echo "layers.sh: FAIL: the layering is broken (see above; docs/ARCHITECTURE.md)" >&2
  exit 1
fi
echo "layers.sh: all layer includes follow the arrows; no hand-declared function"
