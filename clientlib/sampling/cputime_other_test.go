//go:build !linux

package sampling

func threadCPU() (int64, bool) { return 0, false }
