//go:build !amd64

package main

func fmaLoop(n int) {}

func dpbf16Loop(n int) {}

func hasDPBF16() bool { return false }
