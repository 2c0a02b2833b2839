//! `[[models]]`: the OpenAI-style model names served, and the workers' mode each stands for.

use omni_actors::domain::Mode;
use serde::Deserialize;

use omni_actors::settings::Invalid;
use omni_backend_host::workers::WorkerSpec;

/// One `[[models]]` entry: an OpenAI-style `model` name and the modes whose workers serve it.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct ModelEntry {
    pub name: String,
    #[serde(default = "default_model_modes")]
    pub modes: Vec<String>,
}

fn default_model_modes() -> Vec<String> {
    vec!["audio".to_string()]
}

/// A model name and the public mode its sessions queue for (the first listed).
#[derive(Debug, Clone, PartialEq)]
pub struct ModelSpec {
    pub name: String,
    pub mode: Mode,
}

/// Every entry checked against the workers that would serve it; errors name `models[i].KEY`.
pub(super) fn validate(entries: &[ModelEntry], workers: &[WorkerSpec]) -> Result<Vec<ModelSpec>, Invalid> {
    let mut models: Vec<ModelSpec> = Vec::new();
    for (i, m) in entries.iter().enumerate() {
        let spec = m.validate(workers).map_err(|e| e.under(&format!("models[{i}]")))?;
        if models.iter().any(|x| x.name == spec.name) {
            return Err(Invalid::new(format!("models[{i}].name"), format!("'{}' is listed twice", spec.name)));
        }
        models.push(spec);
    }
    Ok(models)
}

impl ModelEntry {
    pub fn validate(&self, workers: &[WorkerSpec]) -> Result<ModelSpec, Invalid> {
        if self.name.trim().is_empty() {
            return Err(Invalid::new("name", "must not be empty"));
        }
        let Some(first) = self.modes.first() else {
            return Err(Invalid::new("modes", "must name at least one of chat, video, audio"));
        };
        for (j, mode) in self.modes.iter().enumerate() {
            mode.parse::<Mode>().map_err(|e| Invalid::new(format!("modes[{j}]"), e))?;
        }
        let mode: Mode = first.parse().map_err(|e| Invalid::new("modes[0]", e))?;
        if !workers.iter().any(|w| w.modes.contains(&mode)) {
            return Err(Invalid::new("modes", format!("no worker serves {mode}")));
        }
        Ok(ModelSpec { name: self.name.clone(), mode })
    }
}
