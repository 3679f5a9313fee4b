module github.com/mlnode-agent/mlnode-agent/tests/programs/nvidia-mocks

go 1.26.0

require (
	github.com/NVIDIA/go-nvlib v0.13.0
	github.com/NVIDIA/go-nvml v0.13.4-1
	github.com/google/uuid v1.6.0
)
