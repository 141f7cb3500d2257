package api

// Regenerate with `make proto` (pinned protoc-gen-go and protoc-gen-go-grpc versions
// live in the Makefile). The generated files are committed so building and testing
// need neither protoc nor the plugins.
//go:generate protoc --go_out=. --go_opt=paths=source_relative --go-grpc_out=. --go-grpc_opt=paths=source_relative tracker.proto config.proto
