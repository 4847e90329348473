//go:build openblas

package catalog

func init() { tagged["openblas"] = true }
