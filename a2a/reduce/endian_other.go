//go:build !(386 || amd64 || arm || arm64 || loong64 || mips64le || mipsle || ppc64le || riscv64 || wasm)

package reduce

// hostLittleEndian is false on big-endian (or unknown) hosts, where every
// multi-byte element goes through encoding/binary instead of a typed view.
const hostLittleEndian = false
