//! The shipped manifests as users render them: real kustomize ([`kustomize`]) and real Helm
//! ([`helm`]).

pub mod helm;
pub mod kustomize;
