//! The events the pipeline's stages exchange.
//!
//! Pixels and JPEG data ride as [`Value::Bytes`], a reference-counted
//! [`bytes::Bytes`]: between stages of one process an image moves by pointer (no
//! copy; the colour stage even writes in place when it holds the only reference),
//! and across processes the same event is serialized (MessagePack `bin`) by leda-net.
//! Because no local attachment is used, one graph runs unchanged under every layout.

use bytes::Bytes;
use leda_core::event::Event;
use leda_core::value::Value;

use crate::error::ImageError;

/// Which output an image becomes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Variant {
    /// The corrected full-size image.
    Full,
    /// The half-resolution copy, written separately.
    Half,
}

impl Variant {
    /// The name used in events and paths.
    pub fn as_str(self) -> &'static str {
        match self {
            Variant::Full => "full",
            Variant::Half => "half",
        }
    }

    fn parse(s: &str) -> Result<Variant, ImageError> {
        match s {
            "full" => Ok(Variant::Full),
            "half" => Ok(Variant::Half),
            other => Err(ImageError::BadEvent(format!("unknown variant '{other}'"))),
        }
    }
}

/// A decoded image in flight: `(name, variant, width, height, pixels)`.
#[derive(Clone, Debug)]
pub struct ImageMsg {
    /// The image's name (the input file's stem).
    pub name: String,
    /// Full-size or half copy.
    pub variant: Variant,
    /// Width in pixels.
    pub width: u32,
    /// Height in pixels.
    pub height: u32,
    /// Packed RGB8 pixels.
    pub pixels: Bytes,
}

/// A compressed image in flight: `(name, variant, jpeg)`.
#[derive(Clone, Debug)]
pub struct JpegMsg {
    /// The image's name.
    pub name: String,
    /// Full-size or half copy.
    pub variant: Variant,
    /// The JPEG file's bytes.
    pub jpeg: Bytes,
}

fn take_str(ev: &mut Event, i: usize, what: &str) -> Result<String, ImageError> {
    match ev.take(i) {
        Value::Str(s) => Ok(s),
        other => Err(ImageError::BadEvent(format!(
            "{what}: expected a string, got {}",
            other.type_name()
        ))),
    }
}

fn take_bytes(ev: &mut Event, i: usize, what: &str) -> Result<Bytes, ImageError> {
    match ev.take(i) {
        Value::Bytes(b) => Ok(b),
        other => Err(ImageError::BadEvent(format!(
            "{what}: expected bytes, got {}",
            other.type_name()
        ))),
    }
}

fn take_dim(ev: &Event, i: usize, what: &str) -> Result<u32, ImageError> {
    ev.arg(i)
        .and_then(Value::as_int)
        .and_then(|v| u32::try_from(v).ok())
        .filter(|&v| v > 0)
        .ok_or_else(|| ImageError::BadEvent(format!("{what}: expected a positive integer")))
}

impl ImageMsg {
    /// Reads an image event (moving the pixels out, no copy).
    pub fn from_event(mut ev: Event) -> Result<ImageMsg, ImageError> {
        if ev.len() != 5 {
            return Err(ImageError::BadEvent(format!(
                "expected (name, variant, width, height, pixels), got {} argument(s)",
                ev.len()
            )));
        }
        let width = take_dim(&ev, 2, "width")?;
        let height = take_dim(&ev, 3, "height")?;
        let name = take_str(&mut ev, 0, "name")?;
        let variant = Variant::parse(&take_str(&mut ev, 1, "variant")?)?;
        let pixels = take_bytes(&mut ev, 4, "pixels")?;
        crate::filters::check_len(&pixels, width, height)?;
        Ok(ImageMsg {
            name,
            variant,
            width,
            height,
            pixels,
        })
    }

    /// The event carrying this image.
    pub fn into_event(self) -> Event {
        Event::from((
            self.name,
            self.variant.as_str(),
            self.width,
            self.height,
            self.pixels,
        ))
    }
}

impl JpegMsg {
    /// Reads a compressed-image event.
    pub fn from_event(mut ev: Event) -> Result<JpegMsg, ImageError> {
        if ev.len() != 3 {
            return Err(ImageError::BadEvent(format!(
                "expected (name, variant, jpeg), got {} argument(s)",
                ev.len()
            )));
        }
        let name = take_str(&mut ev, 0, "name")?;
        let variant = Variant::parse(&take_str(&mut ev, 1, "variant")?)?;
        let jpeg = take_bytes(&mut ev, 2, "jpeg")?;
        Ok(JpegMsg {
            name,
            variant,
            jpeg,
        })
    }

    /// The event carrying this JPEG.
    pub fn into_event(self) -> Event {
        Event::from((self.name, self.variant.as_str(), self.jpeg))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn image_event_round_trip_shares_the_pixels() {
        let px = Bytes::from(vec![1u8; 2 * 3 * 3]);
        let ptr = px.as_ptr();
        let msg = ImageMsg {
            name: "a".into(),
            variant: Variant::Half,
            width: 2,
            height: 3,
            pixels: px,
        };
        let back = ImageMsg::from_event(msg.into_event()).unwrap();
        assert_eq!((back.name.as_str(), back.variant), ("a", Variant::Half));
        assert_eq!(back.pixels.as_ptr(), ptr, "no copy within a process");
    }

    #[test]
    fn malformed_events_are_refused() {
        assert!(ImageMsg::from_event(Event::from("x")).is_err());
        let bad_len = Event::from(("a", "full", 2, 2, Bytes::from(vec![0u8; 5])));
        assert!(matches!(
            ImageMsg::from_event(bad_len),
            Err(ImageError::BadBuffer { .. })
        ));
        let bad_variant = Event::from(("a", "quarter", Bytes::new()));
        assert!(JpegMsg::from_event(bad_variant).is_err());
    }
}
