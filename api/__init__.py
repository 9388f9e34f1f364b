"""EagleNest control plane: AWS JSON 1.1 SageMaker API + sagemaker-runtime."""
