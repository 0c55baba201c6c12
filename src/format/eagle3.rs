//! The EAGLE-3 names, in one place.
//!
//! EAGLE-3 trains a draft model on four parts of each sample: the token ids, the loss mask,
//! the hidden states of a few auxiliary layers concatenated on the last dim (`[T, k·H]`) and
//! the target model's last hidden state (`[T, H]`, after the final norm), the target.
//!
//! hspack writes them as the fields [`INPUT_IDS`] (role `token_ids`), [`LOSS_MASK`] (role
//! `loss_mask`), [`AUX_HIDDEN_STATE`] (role `hidden_states`, row `[k, H]`) and
//! [`hidden_field`]`(layer)` (role `hidden_state`), or one `hidden.{layer}` field per layer when
//! the auxiliary layers are not stacked. Capture, `convert`'s presets and the synthetic data
//! name them so; the Python package reads the same names from `hspack._hspack.EAGLE3`.
//!
//! Other tools name the parts differently, and one word names different parts: EAGLE's and
//! SpecForge's saved samples call the auxiliary concatenation `aux_hidden_state` and the
//! target `hidden_state` ([`SAVED`], also the keys of hspack's `eagle3` view, [`VIEW`]), while
//! SpecForge's dataset items call the concatenation `hidden_state` and the target `target`
//! ([`SPECFORGE_ITEM`], the `eagle3-specforge` view). ModelOpt saves [`MODELOPT_SAVED`];
//! vLLM speculators saves every layer in one tensor ([`SPECULATORS_HIDDEN_STATES`]).

/// The token-id field (role `token_ids`), one id per row.
pub const INPUT_IDS: &str = "input_ids";
/// The loss-mask field (role `loss_mask`), one value per row, non-zero where the loss counts.
pub const LOSS_MASK: &str = "loss_mask";
/// The field stacking the auxiliary layers (role `hidden_states`, row `[k, H]`); a row read
/// flat is their `[k·H]` concatenation.
pub const AUX_HIDDEN_STATE: &str = "aux_hidden_state";
/// The start of the name of a field holding one layer's hidden state: [`hidden_field`].
pub const HIDDEN_PREFIX: &str = "hidden.";
/// The attention mask that SpecForge's dataset items and collator carry, and `PadCollate` adds
/// (1 on real tokens).
pub const ATTENTION_MASK: &str = "attention_mask";

/// The field holding the hidden state of layer id `layer`: `hidden.{layer}`. The final norm's
/// output is the id one past the last decoder layer (`num_layers`, HF's `hidden_states[-1]`), so
/// a 61-layer model's target is `hidden.61`, whoever writes it: capture, `convert` or Python's
/// `hspack.hidden_state(61, H, point="final_norm")`.
pub fn hidden_field(layer: u32) -> String {
    format!("{HIDDEN_PREFIX}{layer}")
}

/// The layer id a field name [`hidden_field`] gives, if `name` is one.
pub fn hidden_field_layer(name: &str) -> Option<u32> {
    name.strip_prefix(HIDDEN_PREFIX)?.parse().ok()
}

/// What one convention calls each part of an EAGLE-3 sample.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Keys {
    /// Token ids.
    pub input_ids: &'static str,
    /// Loss mask.
    pub loss_mask: &'static str,
    /// The auxiliary layers' states, concatenated on the last dim.
    pub aux: &'static str,
    /// The target: the last hidden state, after the final norm.
    pub target: &'static str,
}

impl Keys {
    /// `(part, name)` for each part, the parts named as [`Keys`]' fields are.
    pub const fn entries(&self) -> [(&'static str, &'static str); 4] {
        [
            ("input_ids", self.input_ids),
            ("loss_mask", self.loss_mask),
            ("aux", self.aux),
            ("target", self.target),
        ]
    }
}

/// A sample as EAGLE's `ge_data` scripts (which save no auxiliary layers) and SpecForge's
/// `prepare_hidden_states.py` save it.
pub const SAVED: Keys = Keys {
    input_ids: INPUT_IDS,
    loss_mask: LOSS_MASK,
    aux: AUX_HIDDEN_STATE,
    target: "hidden_state",
};

/// The keys of hspack's `eagle3` view (`Eagle3View(layout="hspack")`): the names of
/// [`SAVED`], so a trainer written for SpecForge's saved files reads it unchanged.
pub const VIEW: Keys = SAVED;

/// The keys of SpecForge's offline dataset items, and of hspack's `eagle3-specforge` view
/// (which adds [`ATTENTION_MASK`] as they do). `hidden_state` is the auxiliary concatenation
/// here, not the target.
pub const SPECFORGE_ITEM: Keys = Keys {
    input_ids: INPUT_IDS,
    loss_mask: LOSS_MASK,
    aux: "hidden_state",
    target: "target",
};

/// A sample as NVIDIA ModelOpt's `collect_hidden_states` saves it.
pub const MODELOPT_SAVED: Keys = Keys {
    input_ids: INPUT_IDS,
    loss_mask: LOSS_MASK,
    aux: "aux_hidden_states",
    target: "hidden_states",
};

/// vLLM speculators' token ids (older files use [`INPUT_IDS`]).
pub const SPECULATORS_TOKEN_IDS: &str = "token_ids";
/// vLLM speculators' hidden states: every captured layer in one `[T, L, H]` tensor, the target
/// last.
pub const SPECULATORS_HIDDEN_STATES: &str = "hidden_states";

/// The field names hspack writes, as `(part, name)`: the parts are `input_ids`, `loss_mask`,
/// `aux` ([`AUX_HIDDEN_STATE`]) and `hidden_prefix`.
pub const FIELDS: [(&str, &str); 4] = [
    ("input_ids", INPUT_IDS),
    ("loss_mask", LOSS_MASK),
    ("aux", AUX_HIDDEN_STATE),
    ("hidden_prefix", HIDDEN_PREFIX),
];

#[cfg(test)]
mod tests {
    use super::*;

    // The names are a contract with trainers and with datasets already written: a change here
    // is a format change.
    #[test]
    fn names_are_the_published_ones() {
        assert_eq!(
            FIELDS,
            [
                ("input_ids", "input_ids"),
                ("loss_mask", "loss_mask"),
                ("aux", "aux_hidden_state"),
                ("hidden_prefix", "hidden."),
            ]
        );
        assert_eq!(
            VIEW.entries(),
            [
                ("input_ids", "input_ids"),
                ("loss_mask", "loss_mask"),
                ("aux", "aux_hidden_state"),
                ("target", "hidden_state"),
            ]
        );
        assert_eq!(
            SPECFORGE_ITEM.entries(),
            [
                ("input_ids", "input_ids"),
                ("loss_mask", "loss_mask"),
                ("aux", "hidden_state"),
                ("target", "target"),
            ]
        );
        assert_eq!(
            (MODELOPT_SAVED.aux, MODELOPT_SAVED.target),
            ("aux_hidden_states", "hidden_states")
        );
        assert_eq!(ATTENTION_MASK, "attention_mask");
    }

    #[test]
    fn hidden_field_names_round_trip() {
        assert_eq!(hidden_field(61), "hidden.61");
        assert_eq!(hidden_field_layer("hidden.61"), Some(61));
        assert_eq!(hidden_field_layer("hidden.final"), None);
        assert_eq!(hidden_field_layer(AUX_HIDDEN_STATE), None);
        for name in [INPUT_IDS, LOSS_MASK, AUX_HIDDEN_STATE] {
            crate::format::schema::check_field_name(name).unwrap();
        }
        crate::format::schema::check_field_name(&hidden_field(u32::MAX)).unwrap();
    }
}
