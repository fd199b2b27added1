//go:build 386 || amd64 || arm || arm64 || loong64 || mips64le || mipsle || ppc64le || riscv64 || wasm

package reduce

// hostLittleEndian allows reinterpreting aligned buffers as typed slices: the
// in-memory layout then equals the little-endian encoding.
const hostLittleEndian = true
