//! The elements' reference (docs/reference.md), generated from the registered elements: their
//! metadata, pads and properties (blurb, type, default, range or values, when it may change),
//! so that the docs cannot fall behind the code. The test fails when the committed file and
//! the elements disagree; `QWENCODEC_WRITE_REFERENCE=1` writes it anew.

use qwencodec_testing as common;

use std::fmt::Write;

use gst::glib;
use gst::prelude::*;

const ELEMENTS: [&str; 4] = [
    "qwencodecdec",
    "qwencodecparse",
    "rtpqwencodespay",
    "rtpqwencodesdepay",
];

/// GstObject's own properties, which every element has.
const SKIPPED: [&str; 2] = ["name", "parent"];

fn cell(text: &str) -> String {
    text.replace('|', "\\|").replace('\n', " ")
}

fn value_text(value: &glib::Value) -> String {
    if let Ok(Some(text)) = value.get::<Option<String>>() {
        return format!("`{text}`");
    }
    if value.get::<Option<String>>().is_ok() {
        return "unset".into();
    }
    match value.serialize() {
        Ok(text) if text.is_empty() => "unset".into(),
        Ok(text) => format!("`{text}`"),
        Err(_) => "unset".into(),
    }
}

/// A number pspec's range, or an enum's values.
fn range_text(pspec: &glib::ParamSpec) -> String {
    macro_rules! range {
        ($($spec:ty),*) => {
            $(if let Some(spec) = pspec.downcast_ref::<$spec>() {
                return format!("{} to {}", spec.minimum(), spec.maximum());
            })*
        };
    }
    range!(
        glib::ParamSpecInt,
        glib::ParamSpecUInt,
        glib::ParamSpecInt64,
        glib::ParamSpecUInt64,
        glib::ParamSpecDouble
    );
    if let Some(spec) = pspec.downcast_ref::<glib::ParamSpecEnum>() {
        return spec
            .enum_class()
            .values()
            .iter()
            .map(|value| format!("`{}`", value.nick()))
            .collect::<Vec<_>>()
            .join(", ");
    }
    String::new()
}

fn when_text(pspec: &glib::ParamSpec) -> &'static str {
    let flags = pspec.flags();
    if !flags.contains(glib::ParamFlags::WRITABLE) {
        "read-only"
    } else if flags.contains(gst::PARAM_FLAG_MUTABLE_PLAYING) {
        "any time"
    } else if flags.contains(gst::PARAM_FLAG_MUTABLE_PAUSED) {
        "up to PAUSED"
    } else if flags.contains(gst::PARAM_FLAG_MUTABLE_READY) {
        "in NULL or READY"
    } else {
        // No flag says when: GStreamer's convention for "in NULL", which elements keep loosely.
        "writable"
    }
}

fn element_reference(name: &str, out: &mut String) {
    let factory = gst::ElementFactory::find(name).unwrap_or_else(|| panic!("{name} is not registered"));
    let element = factory.create().build().unwrap();
    let metadata = |key| factory.metadata(key).unwrap_or_default();
    writeln!(out, "## `{name}`\n").unwrap();
    writeln!(
        out,
        "{} ({}). {}\n",
        metadata(gst::ELEMENT_METADATA_LONGNAME),
        metadata(gst::ELEMENT_METADATA_KLASS),
        metadata(gst::ELEMENT_METADATA_DESCRIPTION)
    )
    .unwrap();
    writeln!(
        out,
        "| pad | direction | presence | caps |\n| --- | --- | --- | --- |"
    )
    .unwrap();
    for template in factory.static_pad_templates() {
        writeln!(
            out,
            "| `{}` | {:?} | {:?} | `{}` |",
            template.name_template(),
            template.direction(),
            template.presence(),
            cell(&template.caps().to_string())
        )
        .unwrap();
    }
    writeln!(
        out,
        "\n| property | of | type | default | range or values | set | description |\n\
         | --- | --- | --- | --- | --- | --- | --- |"
    )
    .unwrap();
    for pspec in element.list_properties() {
        if SKIPPED.contains(&pspec.name()) {
            continue;
        }
        let readable_default = pspec.flags().contains(glib::ParamFlags::WRITABLE)
            && pspec.flags().contains(glib::ParamFlags::READABLE);
        // What a new element holds, which its class may set apart from the pspec's default.
        let default = if readable_default {
            value_text(&element.property_value(pspec.name()))
        } else {
            "–".into()
        };
        writeln!(
            out,
            "| `{}` | {} | {} | {} | {} | {} | {} |",
            pspec.name(),
            pspec.owner_type().name(),
            pspec.value_type().name(),
            default,
            range_text(&pspec),
            when_text(&pspec),
            cell(pspec.blurb().unwrap_or_default())
        )
        .unwrap();
    }
    writeln!(out).unwrap();
}

fn reference() -> String {
    common::init();
    let mut out = String::from(
        "# Element reference\n\n\
         Generated from the registered elements by `tests/reference.rs`: each element's metadata, \
         pads and properties (the class that defines each, its type, what a new element holds, \
         its range or values, when it may be set, and its description as `gst-inspect-1.0` \
         shows it). `make test` fails when this file and the elements disagree; \
         `QWENCODEC_WRITE_REFERENCE=1 cargo test --release --test reference` writes it anew. What \
         the properties do together, and everything else about the elements: \
         [element.md](element.md), [rtp-codes.md](rtp-codes.md).\n\n",
    );
    for name in ELEMENTS {
        element_reference(name, &mut out);
    }
    out.truncate(out.trim_end().len());
    out.push('\n');
    out
}

#[test]
fn the_committed_reference_is_the_elements() {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("docs/reference.md");
    let generated = reference();
    if std::env::var_os("QWENCODEC_WRITE_REFERENCE").is_some() {
        std::fs::write(&path, &generated).unwrap();
    }
    let committed = std::fs::read_to_string(&path).unwrap_or_default();
    assert!(
        committed == generated,
        "docs/reference.md does not say what the elements are: run \
         QWENCODEC_WRITE_REFERENCE=1 cargo test --release --test reference, and commit it"
    );
}

/// What gst-inspect-1.0 shows reads as gst-plugins-rs's elements do: a description of one
/// sentence (no pipelines: those are in docs/element.md), the crate's authors, blurbs of one
/// sentence naming no CPU, and the enums of properties registered as plugin API.
#[test]
fn the_elements_read_as_gst_plugins_rs_elements() {
    common::init();
    let one_sentence = |what: &str, text: &str| {
        assert!(
            !text.contains(". ") && !text.contains("; ") && !text.contains(" ! ") && !text.contains('\n'),
            "{what} is not one sentence: {text:?}"
        );
        for cpu in ["Intel", "AMD", "AVX", "AMX"] {
            assert!(!text.contains(cpu), "{what} names a CPU: {text:?}");
        }
    };
    for name in ELEMENTS {
        let factory = gst::ElementFactory::find(name).unwrap();
        let metadata = |key| factory.metadata(key).unwrap_or_default().to_string();
        one_sentence(name, &metadata(gst::ELEMENT_METADATA_DESCRIPTION));
        assert_eq!(
            metadata(gst::ELEMENT_METADATA_AUTHOR),
            env!("CARGO_PKG_AUTHORS"),
            "{name}"
        );
        let element = factory.create().build().unwrap();
        let own = element.type_();
        for pspec in element.list_properties() {
            if pspec.owner_type() != own {
                continue;
            }
            one_sentence(
                &format!("{name}'s {}", pspec.name()),
                pspec.blurb().unwrap_or_default(),
            );
            if pspec.downcast_ref::<glib::ParamSpecEnum>().is_some() {
                assert!(
                    pspec.value_type().plugin_api_flags().is_some(),
                    "{name}'s {} is an enum not registered as plugin API",
                    pspec.name()
                );
            }
        }
    }
}
